// strata/zero3/checksum.h: CRC-32C (Castagnoli) of checkpoint data.
//
// Example:
//   std::uint32_t c = strata::zero3::crc32c(buf, n);                // whole buffer
//   std::uint32_t c2 = strata::zero3::crc32c(part2, n2, crc32c(part1, n1));   // the same, in pieces
//
// The SSE4.2 crc32 instruction is used when the CPU has it (chosen at run time, no -march needed), else
// a table-driven loop; both give the same value (the standard CRC-32C: crc32c("123456789") = 0xE3069283).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::zero3 {

// Continues a running checksum `crc` (0 to start) over n more bytes.
std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0);
// The portable form (the oracle for the hardware form in tests).
std::uint32_t crc32c_portable(const void* data, std::size_t n, std::uint32_t crc = 0);

}  // namespace strata::zero3
