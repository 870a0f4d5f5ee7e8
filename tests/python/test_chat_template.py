"""Chat templates rendered by gpukit's sandboxed Jinja subset, compared with jinja2
rendering of the same template (in the environment Hugging Face uses:
trim_blocks, lstrip_blocks, loop controls, a json.dumps tojson)."""
import json

import pytest

import gpukit as gk

jinja2 = pytest.importorskip("jinja2")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# A template that exercises the rest of the subset: namespace, loop filters and
# variables, slices, elif, filters, tests, dict/list literals, ~, //, %, block set.
FEATURES = """{#- a comment -#}
{%- set ns = namespace(n=0, sys='') %}
{%- if messages[0].role == 'system' %}{% set ns.sys = messages[0].content | trim %}{% set rest = messages[1:] %}
{%- else %}{% set rest = messages %}{% endif %}
[{{ ns.sys | default('none', true) | upper }}]
{% for m in rest if m.role != 'tool' %}
  {{ loop.index }}/{{ loop.length }} {{ m.role | capitalize }}{{ ':' if m.content else '!' }} {{ m.content | replace('\\n', ' ') }}
  {%- if loop.first %} (first){% elif loop.last %} (last){% else %} (#{{ loop.index0 }}){% endif %}
  {%- set ns.n = ns.n + (m.content | length) %}
  {%- if m.content is string and m.content.startswith('stop') %}{% break %}{% endif %}
{% endfor %}
{% set d = {'a': 1, 'b': [1, 2, 3]} -%}
total={{ ns.n }} {{ d.b | join('-') }} {{ d['a'] ~ '/' ~ (7 // 2) ~ '/' ~ (7 % 3) }} {{ d.b[-1] }} {{ d.b[::-1] }}
{{ 'x' if undefined_var is defined else 'y' }} {{ range(3) | list }} {{ [1, 2] + [3] }} {{ messages | length > 2 }}
{% set block %}B{{ 1 + 1 }}{% endset %}{{ block }} {{ (rest | first).role }} {{ 'a,b,c'.split(',') | reverse | join }}
{%- for k, v in d.items() %} {{ k }}={{ v }}{% endfor %}
{% if add_generation_prompt %}ASSISTANT:{% endif %}"""

MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are "
    "supported!') }}{% endif %}{% endfor %}"
)

TEMPLATES = {"smollm2": SMOLLM2, "llama3": LLAMA3, "qwen2.5": QWEN25, "features": FEATURES}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "  padded system \n"}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?\n\n"}],
    [{"role": "user", "content": "多语言 😀 текст"}, {"role": "assistant", "content": ""},
     {"role": "user", "content": "{{ not a template }} {% if %}"}],
    [{"role": "user", "content": "line1\nline2"}, {"role": "assistant", "content": "stop here"},
     {"role": "user", "content": "after"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": " "}],
]


def _raise(msg):
    raise jinja2.exceptions.TemplateError(msg)


def _reference(template, messages, add_generation_prompt, bos="<s>", eos="</s>"):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=bos, eos_token=eos)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
def test_matches_jinja2(name, conv, gen):
    template, messages = TEMPLATES[name], CONVERSATIONS[conv]
    want = _reference(template, messages, gen)
    got = gk.text.render_chat(template, messages, add_generation_prompt=gen, bos_token="<s>", eos_token="</s>")
    assert got == want


def test_raise_exception():
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert gk.text.render_chat(MISTRAL, msgs, bos_token="<s>", eos_token="</s>") == _reference(MISTRAL, msgs, True)
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.exceptions.TemplateError):
        _reference(MISTRAL, bad, True)
    with pytest.raises(ValueError, match="roles must alternate"):
        gk.text.render_chat(MISTRAL, bad)


@pytest.mark.parametrize("template,match", [
    ("{% for x in range(100000000) %}{{ x }}{% endfor %}", "limit|too long"),
    ("{% set ns = namespace(s='a') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "limit"),
    ("{{ 'a' * 10**12 }}", "limit"),
    ("{{ foo.__class__ }}", "undefined"),
    ("{{ messages.__class__.__mro__ }}", "undefined|method|attribute"),
    ("{% import 'os' as os %}", "unsupported"),
    ("{% macro m() %}{% endmacro %}", "unsupported"),
    ("{{ cycler() }}", "undefined"),
    ("{{ (" * 1000 + "1" + ")" * 1000 + " }}", "deeply"),
    ("{% if x %}", "missing"),
    ("{{ 1 / 0 }}", "division"),
    ("{{ x", "unterminated"),
    ("{{ 'abc'.__len__() }}", "method|not callable|unknown"),
    # quadratic work is charged: copying a big list in every iteration, big substring searches
    ("{% set r = range(1000000) %}{% for i in r %}{% for j in r %}{% break %}{% endfor %}{% endfor %}", "limit"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(22) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"
     "{% for i in range(1000000) %}{% if 'zz' in ns.s %}{% endif %}{% endfor %}", "limit"),
    # deep or cyclic values are refused
    ("{% set ns = namespace(l=none) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}", "deeply"),
    ("{% set ns = namespace() %}{% set ns.me = ns %}", "namespace"),
    ("{% set a = namespace() %}{% set ns = namespace(x=0) %}{% set ns.l = [a] %}", "namespace"),
])
def test_sandbox_and_limits(template, match):
    with pytest.raises(ValueError, match=match):
        gk.text.render_chat(template, [{"role": "user", "content": "hi"}])


def test_render_with_tokenizer_and_errors():
    with pytest.raises(ValueError):
        gk.text.render_chat(SMOLLM2, [{"role": "user"}])
    with pytest.raises(TypeError):
        gk.text.render_chat(SMOLLM2, [{"role": "user", "content": 3}])
    with pytest.raises(TypeError):
        gk.text.render_chat(42, [])
