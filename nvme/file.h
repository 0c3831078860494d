// strata/nvme/file.h: a file opened for the I/O engine, with O_DIRECT when the file system allows it.
//
// Example:
//   auto f = strata::nvme::File::open(dir + "/swap.bin", strata::nvme::OpenMode::create);
//   f.direct();          // false when the directory refused O_DIRECT (warned once, naming the path)
//   f.offset_align();    // 512 on most NVMe drives: queried with statx(STATX_DIOALIGN), not assumed
//   engine.write(f, src, bytes, offset);
//
// Note [direct and buffered halves]: a File holds two descriptors on the same inode, one with O_DIRECT and
// one without. The engine sends every page that a request covers completely through the direct one and
// the partial pages at an unaligned start or end through the buffered one, so that a length or offset
// that is not a multiple of the block size never reads or rewrites neighbouring bytes. Direct I/O is kept
// to whole pages (not just whole logical blocks) because a direct write into a page that a concurrent
// buffered write has dirtied could be overwritten when that page is written back; with this split no page
// is ever touched both ways by requests that run at the same time. Linux keeps the two views coherent for
// requests that follow one another (direct I/O flushes and invalidates the cached range first).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::nvme {

enum class OpenMode {
  read_only,   // the file must exist
  read_write,  // the file must exist
  create,      // read-write, created when missing (never truncated)
};

class File {
 public:
  // Opens `path`; with `direct`, also an O_DIRECT descriptor, falling back to buffered I/O (one warning
  // per directory) when the file system refuses it. Raises IoError naming the path and the errno text.
  static File open(const std::string& path, OpenMode mode, bool direct = true);

  File() = default;
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  bool is_open() const { return buffered_fd_ >= 0; }
  const std::string& path() const { return path_; }
  // O_DIRECT in effect for whole pages (see the note above).
  bool direct() const { return direct_fd_ >= 0; }
  int direct_fd() const { return direct_fd_; }
  int buffered_fd() const { return buffered_fd_; }
  // Alignment of file offsets and lengths for direct I/O (stx_dio_offset_align; 1 when not direct).
  std::size_t offset_align() const { return offset_align_; }
  // Alignment of buffer addresses for direct I/O (stx_dio_mem_align; 1 when not direct). A buffer that
  // is not aligned goes through an aligned bounce buffer.
  std::size_t mem_align() const { return mem_align_; }
  // Granularity of the direct/buffered split: max(offset_align, page size); 1 when not direct.
  std::size_t page_align() const { return page_align_; }

  std::uint64_t size() const;
  // ftruncate; raises IoError.
  void resize(std::uint64_t bytes);
  // fallocate(0) over [offset, offset+bytes): 0 on success, else the errno (EOPNOTSUPP where the file
  // system cannot preallocate; ENOSPC, EFBIG, EDQUOT when full).
  int preallocate(std::uint64_t offset, std::uint64_t bytes);
  void close();

 private:
  std::string path_;
  int buffered_fd_ = -1;
  int direct_fd_ = -1;
  std::size_t offset_align_ = 1, mem_align_ = 1, page_align_ = 1;
};

}  // namespace strata::nvme
