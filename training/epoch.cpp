#include "training/epoch.h"

#include <algorithm>
#include <cstring>

#include "graph/error.h"

namespace onnxtrain {

namespace {

// One feed of the epoch: the whole array, and the batch tensor the session reads (a view into the array when
// rows are fed in order, else a buffer the rows are gathered into).
struct Column {
  const Tensor* all = nullptr;
  Tensor* batch = nullptr;
  Tensor buffer;
  size_t row_bytes = 0;
};

double read_real(const Tensor& t, int64_t i) {
  return t.dtype == DType::Float32 ? static_cast<double>(t.ptr<float>()[i]) : t.ptr<double>()[i];
}

// In double, in kLanes interleaved partial sums: one running sum is a dependent chain of additions (about
// 0.1 ms per step for W1-sk's 82k weights); independent lanes let the compiler keep them in vector registers.
template <class T>
double sum_of_squares(const T* p, int64_t n) {
  constexpr int64_t kLanes = 16;
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] += static_cast<double>(p[i + k]) * static_cast<double>(p[i + k]);
  for (; i < n; ++i) lanes[0] += static_cast<double>(p[i]) * static_cast<double>(p[i]);
  double s = 0;
  for (double v : lanes) s += v;
  return s;
}

double sum_of_squares(const Tensor& w) {
  if (w.device != Device::CPU) return sum_of_squares(w.to(Device::CPU));
  return w.dtype == DType::Float32 ? sum_of_squares(w.ptr<float>(), w.numel())
                                   : sum_of_squares(w.ptr<double>(), w.numel());
}

DType feed_dtype(const Session& s, const std::string& name) {
  const Graph& g = s.training_graph();
  std::string all;
  for (const ValueInfo& v : g.inputs) {
    if (g.is_initializer(v.name)) continue;
    if (v.name == name) return v.type.dtype;
    all += (all.empty() ? "" : ", ") + v.name;
  }
  fail("sample_weight_feed '" + name + "'", "is not a feed of this session; its feeds are: " + all);
}

}  // namespace

EpochResult train_epoch(Session& session, const Feeds& data, const Tensor* sample_weight, const EpochSpec& spec) {
  if (spec.batch_size < 1) fail("batch_size", "expected at least 1, got " + std::to_string(spec.batch_size));
  if (data.empty()) fail("data", "expected at least one feed");
  std::string rows;
  for (const auto& [name, t] : data) {
    const std::string what = "data '" + name + "'";
    if (t.device != Device::CPU) fail(what, "expected a host array, got one on " + device_name(t.device));
    if (t.rank() == 0 || !t.defined()) fail(what, "expected an array with one row per sample, got " + t.describe());
    rows += (rows.empty() ? "'" : ", '") + name + "' " + std::to_string(t.shape[0]);
  }
  const int64_t n = data.begin()->second.shape[0];
  for (const auto& [name, t] : data)
    if (t.shape[0] != n) fail("data", "every array needs one row per sample, but the row counts differ: " + rows);
  for (size_t i = 0; i < spec.order.size(); ++i)
    if (spec.order[i] < 0 || spec.order[i] >= n)
      fail("order[" + std::to_string(i) + "]", "row " + std::to_string(spec.order[i]) + " is out of range [0, " +
                                                   std::to_string(n) + ")");
  DType sw_type = DType::Undefined;
  if (!spec.sample_weight_feed.empty()) {
    if (data.count(spec.sample_weight_feed))
      fail("sample_weight_feed '" + spec.sample_weight_feed + "'", "is also given in data; give the raw weights as "
                                                                    "sample_weight instead");
    sw_type = feed_dtype(session, spec.sample_weight_feed);
    if (sw_type != DType::Float32 && sw_type != DType::Float64)
      fail("sample_weight_feed '" + spec.sample_weight_feed + "'", "expected a float or double feed, got " +
                                                                    dtype_name(sw_type));
  }
  if (sample_weight) {
    if (spec.sample_weight_feed.empty())
      fail("sample_weight", "given, but no sample_weight_feed names the feed that receives it");
    const Tensor& w = *sample_weight;
    if (w.device != Device::CPU || w.rank() != 1 || w.shape[0] != n ||
        (w.dtype != DType::Float32 && w.dtype != DType::Float64))
      fail("sample_weight", "expected " + std::to_string(n) + " float32 or float64 values on the host (one per row), "
                                "got " + w.describe());
  }
  std::vector<const Tensor*> squared;
  for (const std::string& name : spec.squares_of) {
    const Tensor& w = session.weight_value(name);
    if (w.dtype != DType::Float32 && w.dtype != DType::Float64)
      fail("weight '" + name + "'", "squares_of: expected a float or double weight, got " + w.describe());
    squared.push_back(&w);
  }

  const bool gather = !spec.order.empty();
  const int64_t total = gather ? static_cast<int64_t>(spec.order.size()) : n;
  const int64_t cap = std::max<int64_t>(1, std::min(spec.batch_size, total));
  Feeds batch;
  std::vector<Column> columns;
  columns.reserve(data.size());
  for (const auto& [name, t] : data) {
    Column c;
    c.all = &t;
    c.row_bytes = n ? t.nbytes() / static_cast<size_t>(n) : 0;
    std::vector<int64_t> shape = t.shape;
    shape[0] = cap;
    if (gather) c.buffer = Tensor::empty(t.dtype, shape);
    c.batch = &(batch[name] = Tensor::view(t.dtype, std::move(shape), gather ? c.buffer.data : t.data));
    columns.push_back(std::move(c));
  }
  Tensor weights_buffer;
  Tensor* weights = nullptr;
  if (sw_type != DType::Undefined) {
    weights_buffer = Tensor::empty(sw_type, {cap});
    weights = &(batch[spec.sample_weight_feed] = Tensor::view(sw_type, {cap}, weights_buffer.data));
  }

  EpochResult r;
  const int64_t batches = (total + spec.batch_size - 1) / spec.batch_size;
  r.losses.reserve(batches);
  r.rows.reserve(batches);
  r.weight_sums.reserve(batches);
  if (!squared.empty()) r.squares.reserve(batches);
  for (int64_t start = 0; start < total; start += spec.batch_size) {
    const int64_t m = std::min(spec.batch_size, total - start);
    auto row = [&](int64_t i) { return gather ? spec.order[start + i] : start + i; };
    for (Column& c : columns) {
      c.batch->shape[0] = m;
      const auto* src = static_cast<const char*>(c.all->data);
      if (!gather) {
        c.batch->data = const_cast<char*>(src) + static_cast<size_t>(start) * c.row_bytes;
        continue;
      }
      auto* dst = static_cast<char*>(c.buffer.data);
      for (int64_t i = 0; i < m; ++i)
        std::memcpy(dst + static_cast<size_t>(i) * c.row_bytes, src + static_cast<size_t>(row(i)) * c.row_bytes,
                    c.row_bytes);
    }
    double weight_sum = static_cast<double>(m);
    if (sample_weight) {
      weight_sum = 0;
      for (int64_t i = 0; i < m; ++i) weight_sum += read_real(*sample_weight, row(i));
    }
    if (weights) {
      weights->shape[0] = m;
      // scikit-learn's weighted mean: each batch's weights sum to its row count ("mean" losses) or to 1.
      const double target = spec.weights_sum_to_one ? 1.0 : static_cast<double>(m);
      const double scale = weight_sum > 0 ? target / weight_sum : 0.0;
      for (int64_t i = 0; i < m; ++i) {
        // Rounded as the estimators did in numpy: the raw weight times the scale in the raw weight's dtype.
        double v = 0;
        if (!sample_weight) v = spec.weights_sum_to_one ? 1.0 / static_cast<double>(m) : 1.0;
        else if (sample_weight->dtype == DType::Float32)
          v = static_cast<double>(sample_weight->ptr<float>()[row(i)] * static_cast<float>(scale));
        else v = sample_weight->ptr<double>()[row(i)] * scale;
        if (sw_type == DType::Float32) weights_buffer.ptr<float>()[i] = static_cast<float>(v);
        else weights_buffer.ptr<double>()[i] = v;
      }
    }
    if (!squared.empty()) {
      double s = 0;
      for (const Tensor* w : squared) s += sum_of_squares(*w);
      r.squares.push_back(s);
    }
    if (spec.before_step) spec.before_step();
    r.losses.push_back(session.train_step(batch));
    r.rows.push_back(m);
    r.weight_sums.push_back(weight_sum);
  }
  return r;
}

}  // namespace onnxtrain
