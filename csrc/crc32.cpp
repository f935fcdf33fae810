// CRC-32 of the zip container (reflected polynomial 0xEDB88320), two implementations:
//  - folding with carry-less multiplies; with AVX-512 VPCLMULQDQ sixteen lanes at once (Intel, "Fast CRC Computation for Generic Polynomials
//    Using PCLMULQDQ Instruction", 2009; the constants and the fold/Barrett steps are those of
//    zlib/Chromium's crc32_simd.c, crc32_sse42_simd_): 64 bytes per step in four lanes, folded
//    to 128 bits, reduced to 32. It needs >= 64 bytes in a multiple of 16; the rest of a
//    buffer goes through the tables.
//  - slicing-by-8 tables: 8 bytes per step, the fallback (no PCLMUL, or short tails).
// Both work on the inverted register (crc ^ ~0) as zlib does; crc32() inverts at its ends.
#include "hscapture/crc32.h"

#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HSC_CRC_X86 1
#endif

namespace hsc {
namespace {

struct Tables {
    uint32_t t[8][256];
    Tables() {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int b = 0; b < 8; ++b) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
            t[0][i] = c;
        }
        for (int k = 1; k < 8; ++k)
            for (uint32_t i = 0; i < 256; ++i)
                t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
    }
};

const Tables& tables() {
    static const Tables tab;   // built once (thread-safe static initialization)
    return tab;
}

// `crc` and the result are the inverted register.
uint32_t crc_table(uint32_t crc, const uint8_t* p, size_t n) {
    const Tables& T = tables();
    while (n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);   // little-endian hosts only (x86-64, aarch64 as built here)
        const uint32_t lo = crc ^ uint32_t(w);
        const uint32_t hi = uint32_t(w >> 32);
        crc = T.t[7][lo & 0xFF] ^ T.t[6][(lo >> 8) & 0xFF] ^ T.t[5][(lo >> 16) & 0xFF] ^
              T.t[4][lo >> 24] ^ T.t[3][hi & 0xFF] ^ T.t[2][(hi >> 8) & 0xFF] ^
              T.t[1][(hi >> 16) & 0xFF] ^ T.t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = T.t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#ifdef HSC_CRC_X86
#define HSC_SSE_TARGET __attribute__((target("pclmul,sse4.1")))
#define HSC_AVX512_TARGET \
    __attribute__((target("pclmul,sse4.1,avx512f,avx512vl,vpclmulqdq")))

// Fold-by-distance constants, bit-reflected and shifted left by one: {x^(D+32), x^(D-32)}
// mod P for a fold of D bits (the low qword multiplies a lane's low half, the high its high).
alignas(16) const uint64_t k512[] = {0x0154442bd4, 0x01c6e41596};    // D = 512 (4 lanes)
alignas(16) const uint64_t k128[] = {0x01751997d0, 0x00ccaa009e};    // D = 128 (1 lane)
alignas(16) const uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};    // x^64: 128 -> 64 bits
alignas(16) const uint64_t poly[] = {0x01db710641, 0x01f7011641};    // P' and mu (Barrett)
alignas(16) const uint64_t k2048[] = {0x011542778a, 0x01322d1430};  // D = 2048 (16 lanes)

// The four 128-bit lanes x1..x4 (the last 64 folded bytes, x1 the oldest) folded into one,
// then `len` (a multiple of 16) more bytes at `buf`, reduced to the 32-bit register.
HSC_SSE_TARGET uint32_t finish(__m128i x1, __m128i x2, __m128i x3, __m128i x4,
                               const uint8_t* buf, size_t len) {
    __m128i x0 = _mm_load_si128(reinterpret_cast<const __m128i*>(k128)), x5;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {   // single folds of the remaining 16-byte blocks
        x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf));
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    // 128 -> 64 bits
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    // Barrett reduction to 32 bits
    x0 = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return uint32_t(_mm_extract_epi32(x1, 1));
}

// len >= 64, a multiple of 16; `crc` and the result are the inverted register. Four 128-bit
// lanes, each folded 512 bits forward per 64 bytes.
HSC_SSE_TARGET uint32_t crc_pclmul(uint32_t crc, const uint8_t* buf, size_t len) {
    __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x00));
    __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x10));
    __m128i x3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x20));
    __m128i x4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128(int(crc)));
    const __m128i x0 = _mm_load_si128(reinterpret_cast<const __m128i*>(k512));
    buf += 64;
    len -= 64;
    while (len >= 64) {
        __m128i x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        __m128i x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        __m128i x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        __m128i x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x30)));
        buf += 64;
        len -= 64;
    }
    return finish(x1, x2, x3, x4, buf, len);
}

// a * k folded forward, plus b: per 128-bit lane (lo(a) * k.lo) ^ (hi(a) * k.hi) ^ b.
HSC_AVX512_TARGET inline __m512i fold512(__m512i a, __m512i k, __m512i b) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                     _mm512_clmulepi64_epi128(a, k, 0x11), b, 0x96);
}

// len >= 256, a multiple of 16. Sixteen 128-bit lanes in four 512-bit registers (256 bytes),
// each folded 2048 bits forward per step; then into one register (folds of 512 bits), the
// remaining 64-byte blocks, and its four lanes to finish().
HSC_AVX512_TARGET uint32_t crc_vpclmul(uint32_t crc, const uint8_t* buf, size_t len) {
    __m512i z0 = _mm512_loadu_si512(buf);
    __m512i z1 = _mm512_loadu_si512(buf + 64);
    __m512i z2 = _mm512_loadu_si512(buf + 128);
    __m512i z3 = _mm512_loadu_si512(buf + 192);
    z0 = _mm512_xor_si512(z0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(int(crc))));
    buf += 256;
    len -= 256;
    const __m512i k4 = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(k2048)));
    while (len >= 256) {
        z0 = fold512(z0, k4, _mm512_loadu_si512(buf));
        z1 = fold512(z1, k4, _mm512_loadu_si512(buf + 64));
        z2 = fold512(z2, k4, _mm512_loadu_si512(buf + 128));
        z3 = fold512(z3, k4, _mm512_loadu_si512(buf + 192));
        buf += 256;
        len -= 256;
    }
    const __m512i k1 = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(k512)));
    z1 = fold512(z0, k1, z1);
    z2 = fold512(z1, k1, z2);
    z3 = fold512(z2, k1, z3);
    while (len >= 64) {
        z3 = fold512(z3, k1, _mm512_loadu_si512(buf));
        buf += 64;
        len -= 64;
    }
    return finish(_mm512_extracti32x4_epi32(z3, 0), _mm512_extracti32x4_epi32(z3, 1),
                  _mm512_extracti32x4_epi32(z3, 2), _mm512_extracti32x4_epi32(z3, 3), buf, len);
}

bool have_pclmul() {
    static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    return yes;
}

bool have_vpclmul() {
    static const bool yes = have_pclmul() && __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512vl") &&
                            __builtin_cpu_supports("vpclmulqdq");
    return yes;
}
#endif

}  // namespace

uint32_t crc32(uint32_t crc, const void* data, size_t n) {
    auto p = static_cast<const uint8_t*>(data);
    uint32_t c = ~crc;
#ifdef HSC_CRC_X86
    if (n >= 64 && have_pclmul()) {
        const size_t body = n & ~size_t(15);
        c = body >= 256 && have_vpclmul() ? crc_vpclmul(c, p, body) : crc_pclmul(c, p, body);
        p += body;
        n -= body;
    }
#endif
    return ~crc_table(c, p, n);
}

bool crc32_by(const char* impl, uint32_t crc, const void* data, size_t n, uint32_t* out) {
    auto p = static_cast<const uint8_t*>(data);
    uint32_t c = ~crc;
    const std::string name(impl);
    if (name != "table") {
#ifdef HSC_CRC_X86
        const bool wide = name == "vpclmul";
        if ((!wide && name != "pclmul") || !have_pclmul() || (wide && !have_vpclmul()))
            return false;
        if (n >= 64) {
            const size_t body = n & ~size_t(15);
            c = wide && body >= 256 ? crc_vpclmul(c, p, body) : crc_pclmul(c, p, body);
            p += body;
            n -= body;
        }
#else
        return false;
#endif
    }
    *out = ~crc_table(c, p, n);
    return true;
}

const char* crc32_impl() {
#ifdef HSC_CRC_X86
    if (have_vpclmul()) return "vpclmul";
    if (have_pclmul()) return "pclmul";
#endif
    return "table";
}

}  // namespace hsc
