// The argmax's packed key, shared by argmax.cu and lm_head_screen.cu (one definition of the order both compare in).
// argmax_order: an order-preserving map of a bf16 bit pattern to u16 (sign-magnitude -> unsigned; -0.0 == +0.0; any
// NaN, either sign, is the maximum 0xFFFF, as torch.argmax takes it). argmax_key: that order << 32 | ~index, so that
// the max key is the max value with the smallest index and both argmax stages are plain u64 max-reductions.
#pragma once
#include <cstdint>

__device__ __forceinline__ uint32_t argmax_order(uint32_t b16) {
    if (b16 == 0x8000u) b16 = 0;  // -0.0 ties with +0.0
    uint32_t ord = (b16 & 0x8000u) ? (~b16 & 0xFFFFu) : (b16 | 0x8000u);
    if ((b16 & 0x7FFFu) > 0x7F80u) ord = 0xFFFFu;  // any NaN is the maximum
    return ord;
}

__device__ __forceinline__ uint64_t argmax_key(uint32_t b16, uint32_t idx) {
    return (uint64_t(argmax_order(b16)) << 32) | uint64_t(~idx);
}
