#include "training/data_parallel.h"

#include <algorithm>
#include <queue>
#include <set>

#include "graph/builder.h"
#include "graph/error.h"
#include "graph/validate.h"

namespace onnxtrain {

namespace {

bool is_op(const Node& n, const char* op) { return n.domain == kCollectiveDomain && n.op_type == op; }

// One bucket's nodes: AllReduce, or AllReduceStart + AllReduceWait.
void emit_bucket(GraphBuilder& b, const std::vector<const ReducedValue*>& bucket, ReduceOp op,
                 const BucketOptions& o, std::map<std::string, std::string>& reduced) {
  if (bucket.empty()) return;
  std::vector<std::string> ins, outs;
  for (const ReducedValue* v : bucket) {
    ins.push_back(v->name);
    outs.push_back(b.unique_name(v->name + "/allreduced"));
  }
  std::map<std::string, Attribute> attrs = {{"reduction", reduce_op_name(op)}};
  if (o.compression != "none") attrs["compression"] = o.compression;
  if (!o.overlap) {
    b.add_node(kAllReduceOp, ins, outs.size(), attrs, kCollectiveDomain, outs);
  } else {
    const std::string token = b.unique_name(ins.front() + "/allreduce_started");
    b.add_node(kAllReduceStartOp, ins, 1, attrs, kCollectiveDomain, {token});
    b.set_type(token, TypeInfo{DType::UInt8, Shape{Dim::of(1)}});
    std::vector<std::string> wait_ins = {token};
    wait_ins.insert(wait_ins.end(), ins.begin(), ins.end());
    b.add_node(kAllReduceWaitOp, wait_ins, outs.size(), {}, kCollectiveDomain, outs);
  }
  for (size_t i = 0; i < ins.size(); ++i) {
    if (const TypeInfo* t = b.graph().type_of(ins[i])) b.set_type(outs[i], *t);
    reduced[ins[i]] = outs[i];
  }
}

}  // namespace

std::map<std::string, std::string> insert_allreduce(Graph& g, const std::vector<ReducedValue>& values, ReduceOp op,
                                                    size_t bucket_bytes) {
  BucketOptions o;
  o.bucket_bytes = bucket_bytes;
  return insert_allreduce(g, values, op, o);
}

std::map<std::string, std::string> insert_allreduce(Graph& g, const std::vector<ReducedValue>& values, ReduceOp op,
                                                    const BucketOptions& o) {
  if (o.bucket_bytes == 0) fail("bucket_bytes", "expected a positive number of bytes");
  compression_dtype(o.compression, "compression");
  // The order the backward pass produces them: the last layer's gradients first.
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const std::string& out : g.nodes[i].outputs) producer.emplace(out, i + 1);
  std::vector<const ReducedValue*> order;
  for (const ReducedValue& v : values) order.push_back(&v);
  auto made_at = [&](const ReducedValue* v) {
    auto it = producer.find(v->name);
    return it == producer.end() ? size_t(0) : it->second;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](const ReducedValue* a, const ReducedValue* b) { return made_at(a) < made_at(b); });
  GraphBuilder b(g, "allreduce/");
  std::map<std::string, std::string> reduced;
  // Buckets fill in that order, one open bucket per dtype (and, with compression, per exactness).
  const bool compress = o.compression != "none";
  using Key = std::pair<DType, bool>;  // dtype, travels uncompressed
  std::map<Key, std::pair<std::vector<const ReducedValue*>, size_t>> open;
  auto emit = [&](const Key& key, std::vector<const ReducedValue*>& bucket) {
    BucketOptions bo = o;
    // Only float32 values are compressed: float64 ones (a float64 model) travel as they are.
    if (key.first != DType::Float32 || key.second) bo.compression = "none";
    emit_bucket(b, bucket, op, bo, reduced);
    bucket.clear();
  };
  for (const ReducedValue* pv : order) {
    const ReducedValue& v = *pv;
    if (v.dtype != DType::Float32 && v.dtype != DType::Float64)
      fail("allreduce of '" + v.name + "'", "expected float32 or float64, got " + dtype_name(v.dtype));
    if (reduced.count(v.name)) fail("allreduce of '" + v.name + "'", "the value is listed twice");
    const Key key{v.dtype, compress && v.exact};
    auto& [bucket, bytes] = open[key];
    if (!bucket.empty() && bytes + v.bytes > o.bucket_bytes) {
      emit(key, bucket);
      bytes = 0;
    }
    bucket.push_back(&v);
    bytes += v.bytes;
  }
  for (auto& [key, ob] : open) emit(key, ob.first);
  return reduced;
}

void place_collectives(Graph& g) {
  if (std::none_of(g.nodes.begin(), g.nodes.end(),
                   [](const Node& n) { return is_op(n, kAllReduceStartOp) || is_op(n, kAllReduceWaitOp); }))
    return;
  sort_topologically(g);
  // Starts: each right after the node producing its last input (the other nodes keep their order).
  {
    std::vector<Node> rest, starts;
    for (Node& n : g.nodes) (is_op(n, kAllReduceStartOp) ? starts : rest).push_back(std::move(n));
    std::map<std::string, size_t> producer;  // value -> 1 + index in rest
    for (size_t i = 0; i < rest.size(); ++i)
      for (const std::string& out : rest[i].outputs) producer.emplace(out, i + 1);
    std::vector<std::pair<size_t, size_t>> after;  // (nodes of rest before it, index into starts)
    for (size_t k = 0; k < starts.size(); ++k) {
      size_t at = 0;
      for (const std::string& in : starts[k].inputs)
        if (auto it = producer.find(in); it != producer.end()) at = std::max(at, it->second);
      after.emplace_back(at, k);
    }
    std::stable_sort(after.begin(), after.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<Node> nodes;
    size_t next = 0;
    for (size_t i = 0; i <= rest.size(); ++i) {
      while (next < after.size() && after[next].first <= i) nodes.push_back(std::move(starts[after[next++].second]));
      if (i < rest.size()) nodes.push_back(std::move(rest[i]));
    }
    g.nodes = std::move(nodes);
  }
  // Waits: as late as possible, and what reads a reduction that completes early (the optimizer's update of the
  // last layers) before the waits of later ones. Each node counts the latest wait it depends on (the waits in
  // start order; -1: none); a stable topological order by (that count, position) runs everything that needs no
  // reduction first (the whole backward pass, with its starts), then wait 0 and what only it enables, wait 1, ...
  const size_t n = g.nodes.size();
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < n; ++i)
    for (const std::string& out : g.nodes[i].outputs) producer.emplace(out, i);
  std::vector<std::vector<size_t>> readers(n);
  std::vector<size_t> missing(n, 0);
  std::vector<long> dep(n, -1);
  long waits = 0;
  for (size_t i = 0; i < n; ++i) {  // in topological order: producers first
    std::set<size_t> from;
    std::vector<std::string> reads = g.nodes[i].inputs;
    for (const std::string& v : subgraph_outer_references(g.nodes[i])) reads.push_back(v);
    for (const std::string& v : reads)
      if (auto it = producer.find(v); it != producer.end() && it->second != i) from.insert(it->second);
    for (size_t p : from) {
      readers[p].push_back(i);
      dep[i] = std::max(dep[i], dep[p]);
    }
    missing[i] = from.size();
    if (is_op(g.nodes[i], kAllReduceWaitOp)) dep[i] = std::max(dep[i], waits++);
  }
  using Key = std::pair<long, size_t>;
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i)
    if (missing[i] == 0) ready.push({dep[i], i});
  std::vector<Node> nodes;
  nodes.reserve(n);
  while (!ready.empty()) {
    const size_t i = ready.top().second;
    ready.pop();
    nodes.push_back(std::move(g.nodes[i]));
    for (size_t r : readers[i])
      if (--missing[r] == 0) ready.push({dep[r], r});
  }
  if (nodes.size() != n) fail("place_collectives", "the graph has a cycle");
  g.nodes = std::move(nodes);
}

void remove_allreduce(Graph& g) {
  std::map<std::string, std::string> original;
  std::erase_if(g.nodes, [&](const Node& n) {
    if (!is_collective(n)) return false;
    const size_t first = is_op(n, kAllReduceWaitOp) ? 1 : 0;  // a wait's input 0 is its start's token
    if (!is_op(n, kAllReduceStartOp))
      for (size_t i = 0; i < n.outputs.size() && first + i < n.inputs.size(); ++i)
        original[n.outputs[i]] = n.inputs[first + i];
    else
      original[n.outputs.at(0)] = "";
    return true;
  });
  if (original.empty()) return;
  auto rename = [&](std::string& v) {
    if (auto it = original.find(v); it != original.end()) v = it->second;
  };
  for (Node& n : g.nodes)
    for (std::string& in : n.inputs) rename(in);
  for (ValueInfo& out : g.outputs) rename(out.name);
  for (const auto& [reduced, from] : original) g.value_info.erase(reduced);
}

}  // namespace onnxtrain
