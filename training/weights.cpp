#include "training/weights.h"

#include <algorithm>
#include <cstring>

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
  return find_trainable(const_cast<TensorStore&>(store), trainable, name).clone();
}

std::map<std::string, Tensor> copy_trainable(const TensorStore& store, const std::vector<std::string>& trainable) {
  std::map<std::string, Tensor> r;
  for (const std::string& w : trainable) r[w] = store.at(w).clone();
  return r;
}

void set_trainable(TensorStore& store, const std::vector<std::string>& trainable, const std::string& name,
                   const Tensor& value) {
  Tensor& dst = find_trainable(store, trainable, name);
  if (value.dtype != dst.dtype || value.shape != dst.shape)
    fail("weight '" + name + "'", "expected " + dst.describe() + ", got " + value.describe());
  std::memcpy(dst.data, value.data, dst.nbytes());
}

}  // namespace onnxtrain
