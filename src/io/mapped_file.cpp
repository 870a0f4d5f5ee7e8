// Read-only memory maps of whole files.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gpukit/errors.h"
#include "gpukit/io.h"

namespace gk::io {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ValueError(cat("cannot open '", path, "': ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw ValueError(cat("cannot stat '", path, "': ", std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ValueError(cat("'", path, "' is not a regular file"));
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = size_t(st.st_size);
  if (f->size_ > 0) {
    // Private and writable: a write through an array view changes this process's
    // copy-on-write page, never the file, and does not fault.
    void* p = ::mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw ValueError(cat("cannot map '", path, "': ", std::strerror(e)));
    }
    f->data_ = static_cast<const uint8_t*>(p);
    f->mapped_ = true;
  }
  ::close(fd);
  return f;
}

std::shared_ptr<MappedFile> MappedFile::from_bytes(const void* data, size_t size, std::string name) {
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = std::move(name);
  f->owned_.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + size);
  f->data_ = f->owned_.data();
  f->size_ = size;
  return f;
}

MappedFile::~MappedFile() {
  if (mapped_ && data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace gk::io
