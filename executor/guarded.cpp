#include "executor/guarded.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <map>
#include <string>

#include "graph/error.h"

namespace onnxtrain {

namespace {

// Every live buffer with its mapped length, and how many scopes (GuardedAccess, KernelScope) have it open. One
// mutex guards both, so a buffer allocated or freed while another thread opens or closes the memory is never left
// in between.
struct Registry {
  std::mutex mu;
  std::map<char*, size_t> buffers;  // ordered: neighbouring mappings are protected with one call
  int open = 0;
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: tensors in static storage may outlive main
  return *r;
}

size_t page_size() {
  static const size_t p = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

// Every buffer to `prot`, one mprotect per run of adjacent mappings (the kernel tends to place new mappings next
// to the last ones): a session has hundreds of buffers, and each plan run opens and closes them all.
bool protect_all(const Registry& r, int prot) {
  bool ok = true;
  for (auto it = r.buffers.begin(); it != r.buffers.end();) {
    char* begin = it->first;
    char* end = begin + it->second;
    for (++it; it != r.buffers.end() && it->first == end; ++it) end += it->second;
    ok = ::mprotect(begin, static_cast<size_t>(end - begin), prot) == 0 && ok;
  }
  return ok;
}

// The pages of the buffer holding [p, p + n), or nothing when p is not guarded memory.
std::pair<char*, size_t> pages_of(const Registry& r, const void* p, size_t n) {
  auto it = r.buffers.upper_bound(static_cast<char*>(const_cast<void*>(p)));
  if (it == r.buffers.begin()) return {nullptr, 0};
  --it;
  const char* q = static_cast<const char*>(p);
  if (q + n > it->first + it->second) return {nullptr, 0};
  return {it->first, it->second};
}

}  // namespace

void* guarded_allocate(size_t bytes) {
  const size_t len = (std::max<size_t>(bytes, 1) + page_size() - 1) / page_size() * page_size();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // Anonymous mappings are zeroed, as Tensor::empty promises.
  void* p = ::mmap(nullptr, len, r.open ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("guarded device: cannot map " + std::to_string(len) + " bytes: " + std::strerror(errno));
  r.buffers.emplace(static_cast<char*>(p), len);
  return p;
}

void guarded_free(void* p) {
  if (!p) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.buffers.find(static_cast<char*>(p));
  if (it == r.buffers.end()) return;
  ::munmap(p, it->second);
  r.buffers.erase(it);
}

void open_guarded_memory() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.open++ == 0 && !protect_all(r, PROT_READ | PROT_WRITE)) {
    protect_all(r, PROT_NONE);
    --r.open;
    throw Error(std::string("guarded device: mprotect failed: ") + std::strerror(errno));
  }
}

void close_guarded_memory() noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (--r.open == 0) protect_all(r, PROT_NONE);  // called from destructors: must not throw
}

void guarded_copy(void* dst, const void* src, size_t n) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);  // no other thread closes the memory while this copies
  if (r.open > 0) {
    std::memmove(dst, src, n);
    return;
  }
  // Only the one or two buffers involved are opened: a session reads and writes scalars every step.
  const auto a = pages_of(r, dst, n), b = pages_of(r, src, n);
  for (auto [p, len] : {a, b})
    if (p && ::mprotect(p, len, PROT_READ | PROT_WRITE) != 0)
      throw Error(std::string("guarded device: mprotect failed: ") + std::strerror(errno));
  std::memmove(dst, src, n);
  for (auto [p, len] : {a, b})
    if (p) ::mprotect(p, len, PROT_NONE);
}

size_t guarded_buffers() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.buffers.size();
}

bool guarded_memory_open() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.open > 0;
}

}  // namespace onnxtrain
