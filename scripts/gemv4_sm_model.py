"""A discrete-time model of one SM running the staged int4 GEMV (docs/notes/gemv4-s10-prep.md, section 1): which
effective decode time per warp-stage reproduces the H200's figures, and what variant 62's earlier requests could gain.

Memory: the SM's share of the copy bandwidth (B bytes per cycle, a FIFO) followed by a fixed latency L0. Decode: each
of the 4 SMSPs shares its time among its decoding warps (processor sharing); a stage costs C SMSP-cycles; one warp alone
gets at most 1 / R of its SMSP (R: a warp's dependency chains). Modes: 56 the copies probe (issue after the wait, no
decode), 48 (issue after the wait, then decode), 62 (issue the next stage before the wait). No GPU, no dependencies.

    python scripts/gemv4_sm_model.py            # the table of the notes
"""


def run(mode, warps, stages, c, b=15.8, l0=1200.0, r=1.0, stage_bytes=4416, dt=2.0):
    free = [0.0]

    def req(t):  # one stage's copies issued at t: when they have landed
        start = max(t, free[0])
        free[0] = start + stage_bytes / b
        return free[0] + l0

    land = [[None] * (stages + 1) for _ in range(warps)]
    state = []  # per warp: [stage, phase, remaining SMSP-cycles]
    for w in range(warps):  # every warp's stage 0 (issued before the PDL wait), then 62's stage 1
        land[w][0] = req(0.0)
        state.append([0, "wait", 0.0])
    for w in range(warps):
        if mode == 62 and stages > 1:
            land[w][1] = req(0.0)
    t, done = 0.0, [None] * warps
    while any(d is None for d in done):
        for w in range(warps):
            j, ph, _ = state[w]
            if done[w] is None and ph == "wait" and land[w][j] is not None and land[w][j] <= t:
                if mode in (48, 56) and j + 1 < stages:
                    land[w][j + 1] = req(t)
                state[w] = [j, "dec", c if mode != 56 else 1.0]
        for s in range(4):
            act = [w for w in range(warps) if w % 4 == s and state[w][1] == "dec" and done[w] is None]
            for w in act:
                state[w][2] -= min(1.0 / len(act), 1.0 / r) * dt
                if state[w][2] <= 0:
                    j = state[w][0]
                    if j + 1 == stages:
                        done[w] = t
                    else:
                        if mode == 62 and j + 2 < stages:
                            land[w][j + 2] = req(t)
                        state[w] = [j + 1, "wait", 0.0]
        t += dt
    return max(done)


def main():
    # (name, warps per SM, stages per warp, stages the SM moves in all): 48's plan
    shapes = (("K4096_N14336", 14, 4, 14 * 4), ("K14336_N4096", 16, 4, 16 * 3.5))
    print("% of the copy rate (model); C: SMSP-cycles per warp-stage (48: max(issue 558, 2 x ALU 290) = 580), "
          "62's C = 520 / 580 of 48's")
    for r in (1.0, 2.0):
        for c in (580, 900, 1200, 1300):
            row = []
            for name, w, s, tot in shapes:
                ideal = tot * 4416 / 15.8
                row.append(name + " " + " ".join(f"{m}:{100 * ideal / run(m, w, s, cc, r=r):.0f}"
                                                 for m, cc in ((56, 0), (48, c), (62, c * 520 / 580))))
            print(f"R {r} C {c}: " + " | ".join(row))


if __name__ == "__main__":
    main()
