// CRC-32 (ISO-HDLC: zlib's crc32, the zip container's), the same values as zlib.crc32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hsc {

// The CRC-32 of `n` bytes at `p` continuing `crc` (0 to start; pass the previous result to
// continue a stream): crc32(crc32(0, a), b) == crc32(0, a + b). Carry-less multiply
// (PCLMULQDQ) folding where the CPU has it (checked once at run time), else slicing-by-8
// tables. Pure function, no shared state after the first call: any thread, GIL released.
uint32_t crc32(uint32_t crc, const void* p, size_t n);

// One implementation by name, for the tests that pin each against zlib: "table", "pclmul"
// (128-bit folds), "vpclmul" (AVX-512 folds; buffers under 256 bytes go by "pclmul"). False
// (nothing computed) when this CPU lacks what it needs or the name is unknown.
bool crc32_by(const char* impl, uint32_t crc, const void* p, size_t n, uint32_t* out);

// Which implementation crc32() uses on this CPU: "vpclmul", "pclmul" or "table".
const char* crc32_impl();

}  // namespace hsc
