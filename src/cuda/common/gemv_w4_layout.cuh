// The staged 4-bit GEMV's formats and stage layout (common/gemv_w4.cuh's k_w4, the kernel's description, and its
// launch in gemv_w4_staged.cu): the int4 / NVF4 format traits, the shared-memory layout of one stage, the chunk
// swizzle and the per-block fragment of the shared-memory reads.
#pragma once
#include <cstdint>

namespace gk::cuda::gemv_detail {


// ---- formats ----
// NG: groups per 128-weight block (the lane's pieces), LB: bytes per lane, row and group;
// SB / ZB: scale / zero-point bytes per row and block.
template <int G_>
struct W4Int4 {
  static constexpr int G = G_, NG = 128 / G, LB = G / 8, WPG = LB / 4, SB = 4 * NG, ZB = NG;
  static constexpr bool kNvf4 = false;
};
struct W4Nvf4 {
  static constexpr int G = 128, NG = 1, LB = 16, WPG = 4, SB = 8, ZB = 0;
  static constexpr bool kNvf4 = true;
};

// Shared-memory layout of one stage: codes (16 rows x KB * 64), scales (16 rows x SP), zero
// points (16 rows x ZP). SP is padded by 16 bytes when >= 32 (rows g of a warp instruction
// then fall in different banks). Scales and zero points are copied in units of US / UZ
// bytes; NARROW (rows of scales / zero points not 16-byte aligned, K % 512 != 0): int4 scales
// in 4-byte units (NVF4's block scales: 8), zero points as the 4-byte aligned words around
// each row's bytes (the row's misalignment, the same for all its stages, is undone on reading).
template <class F, int KB, bool NARROW = false>
struct W4Layout {
  static constexpr int P = KB * 64;
  static constexpr int SR = KB * F::SB;                 // scale bytes per row
  static constexpr int SP = SR >= 32 ? SR + 16 : SR;    // their pitch
  static constexpr int ZR = KB * F::ZB;                 // zero bytes per row
  // ZW (KB = 2, int4 g128: 2 zero bytes per row and stage): the aligned 4-byte word around them
  static constexpr bool ZW = !NARROW && ZR == 2;
  static constexpr int ZP = NARROW && ZR > 0 ? ZR + 8 : (ZW ? 4 : ZR);  // their pitch
  static constexpr int US = NARROW ? (F::kNvf4 ? 8 : 4) : (SR < 16 ? SR : 16);  // copy unit of the scales
  static constexpr int UZ = NARROW || ZW ? 4 : (ZR < 16 ? ZR : 16);             // of the zero points
  static constexpr int NUZ = ZR == 0 ? 0 : (NARROW ? (ZR + 4) / 4 : (ZW ? 1 : ZR / UZ));  // zero units per row
  static constexpr int CODES = 16 * P, SCALES = 16 * SP, ZEROS = 16 * ZP;
  static constexpr int STAGE = CODES + SCALES + ZEROS;  // a multiple of 16
  static_assert(STAGE % 16 == 0 && (F::ZB == 0 || UZ >= 4) && US >= 4, "copy units of 4, 8 or 16 bytes");
};

__device__ __forceinline__ int w4_swz(int r) {  // bitrev3(r & 7): the chunk XOR of row r
  return ((r & 1) << 2) | (r & 2) | ((r >> 2) & 1);
}

// The shared-memory reads of one 128-weight block (rows g, g + 8): zero points, codes, scales.
struct W4Frag {
  uint32_t za, zb;  // int4: the rows' NG zero-point bytes
  uint4 wa, wb;     // the lane's 4 code words of rows g and g + 8
  uint4 sva, svb;   // int4: the NG f32 scales; NVF4: .x = the 2 e4m3 block scales 2t, 2t + 1
};

}  // namespace gk::cuda::gemv_detail
