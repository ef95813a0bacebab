#include "executor/guarded.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "graph/error.h"

namespace onnxtrain {

namespace {

// Every live buffer with its mapped length, and how many GuardedAccess scopes are open. One mutex guards both,
// so a buffer allocated or freed while another thread opens or closes the memory is never left in between.
struct Registry {
  std::mutex mu;
  std::unordered_map<void*, size_t> buffers;
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

void protect(void* p, size_t len, int prot) {
  if (::mprotect(p, len, prot) != 0)
    throw Error(std::string("guarded device: mprotect failed: ") + std::strerror(errno));
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
  r.buffers.emplace(p, len);
  return p;
}

void guarded_free(void* p) {
  if (!p) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.buffers.find(p);
  if (it == r.buffers.end()) return;
  ::munmap(p, it->second);
  r.buffers.erase(it);
}

void open_guarded_memory() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.open++ == 0)
    for (const auto& [p, len] : r.buffers) protect(p, len, PROT_READ | PROT_WRITE);
}

void close_guarded_memory() noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (--r.open == 0)
    for (const auto& [p, len] : r.buffers) ::mprotect(p, len, PROT_NONE);  // a destructor must not throw
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
