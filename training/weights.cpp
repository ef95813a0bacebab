#include "training/weights.h"

#include <algorithm>
#include <cstring>

#include "executor/transfer.h"
#include "graph/error.h"

namespace onnxtrain {

namespace {

Tensor& find_trainable(TensorStore& store, const std::vector<std::string>& trainable, const std::string& name) {
  auto it = store.find(name);
  if (it == store.end() || std::find(trainable.begin(), trainable.end(), name) == trainable.end())
    fail("weight '" + name + "'", "is not a trainable weight of this session");
  return it->second;
}

}  // namespace

Tensor get_trainable(const TensorStore& store, const std::vector<std::string>& trainable, const std::string& name) {
  return find_trainable(const_cast<TensorStore&>(store), trainable, name).to(Device::CPU);
}

std::map<std::string, Tensor> copy_trainable(const TensorStore& store, const std::vector<std::string>& trainable) {
  std::map<std::string, Tensor> r;
  for (const std::string& w : trainable) r[w] = store.at(w).to(Device::CPU);
  return r;
}

void set_trainable(TensorStore& store, const std::vector<std::string>& trainable, const std::string& name,
                   const Tensor& value) {
  copy_into(find_trainable(store, trainable, name), value, "weight '" + name + "'");
}

}  // namespace onnxtrain
