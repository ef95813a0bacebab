#include "training/data.h"

#include <zip.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "training/sampler.h"
#include "graph/error.h"

namespace onnxtrain {

namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail(p.string(), "cannot open the file");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

DType npy_dtype(const std::string& descr, const std::string& where) {
  // '|' = byte order not applicable, '<' little endian, '=' native (little on every platform we build for).
  static const std::map<std::string, DType> types = {
      {"b1", DType::Bool},   {"u1", DType::UInt8},   {"i1", DType::Int8},    {"u2", DType::UInt16},
      {"i2", DType::Int16},  {"u4", DType::UInt32},  {"i4", DType::Int32},   {"u8", DType::UInt64},
      {"i8", DType::Int64},  {"f4", DType::Float32}, {"f8", DType::Float64}, {"f2", DType::Float16}};
  if (descr.size() == 3 && (descr[0] == '<' || descr[0] == '|' || descr[0] == '=')) {
    auto it = types.find(descr.substr(1));
    if (it != types.end()) return it->second;
  }
  std::string valid;
  for (const auto& [k, v] : types) valid += (valid.empty() ? "" : ", ") + dtype_name(v);
  fail(where, "unsupported array type '" + descr + "' (big-endian, structured and object arrays are not read); "
              "supported: " + valid);
}

// The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
std::string header_value(const std::string& h, const std::string& key, const std::string& where) {
  size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) fail(where, "malformed .npy header: no '" + key + "'");
  size_t c = h.find(':', k);
  if (c == std::string::npos) fail(where, "malformed .npy header near '" + key + "'");
  size_t b = h.find_first_not_of(' ', c + 1);
  if (b == std::string::npos) fail(where, "malformed .npy header near '" + key + "'");
  size_t e;
  if (h[b] == '\'') e = h.find('\'', b + 1) + 1;
  else if (h[b] == '(') e = h.find(')', b) + 1;
  else e = h.find_first_of(",}", b);
  if (e == std::string::npos || e == 0) fail(where, "malformed .npy header near '" + key + "'");
  return h.substr(b, e - b);
}

Tensor parse_npy(const std::string& bytes, const std::string& where) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) fail(where, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t len, start;
  if (major == 1) {
    len = static_cast<unsigned char>(bytes[8]) | static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(where, "truncated .npy header");
    len = 0;
    for (int i = 3; i >= 0; --i) len = len << 8 | static_cast<unsigned char>(bytes[8 + i]);
    start = 12;
  } else {
    fail(where, ".npy format version " + std::to_string(major) + " is not supported (1, 2, 3 are)");
  }
  if (bytes.size() < start + len) fail(where, "truncated .npy header");
  const std::string h = bytes.substr(start, len);
  std::string descr = header_value(h, "descr", where);
  if (descr.size() < 2 || descr.front() != '\'') fail(where, "unsupported array type " + descr);
  const DType dt = npy_dtype(descr.substr(1, descr.size() - 2), where);
  if (header_value(h, "fortran_order", where) != "False")
    fail(where, "Fortran-ordered arrays are not read; save with np.ascontiguousarray(a)");
  std::string shape_text = header_value(h, "shape", where);
  std::vector<int64_t> shape;
  for (size_t p = 1; p < shape_text.size();) {
    size_t q = shape_text.find_first_of(",)", p);
    std::string d = shape_text.substr(p, q - p);
    d.erase(std::remove(d.begin(), d.end(), ' '), d.end());
    if (!d.empty()) {
      try {
        shape.push_back(std::stoll(d));
      } catch (const std::exception&) {
        fail(where, "malformed shape " + shape_text + " in the .npy header");
      }
    }
    if (q == std::string::npos) break;
    p = q + 1;
  }
  Tensor t = Tensor::empty(dt, shape);
  const size_t have = bytes.size() - start - len;
  if (have < t.nbytes())
    fail(where, "truncated: the header says " + t.describe() + " (" + std::to_string(t.nbytes()) + " bytes) but " +
                    std::to_string(have) + " bytes follow");
  std::memcpy(t.data, bytes.data() + start + len, t.nbytes());
  return t;
}

template <class F> void with_type(DType t, const std::string& what, F&& f) {
  switch (t) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Int64: return f(int64_t{});
    case DType::Int32: return f(int32_t{});
    case DType::Int16: return f(int16_t{});
    case DType::Int8: return f(int8_t{});
    case DType::UInt8: return f(uint8_t{});
    case DType::UInt16: return f(uint16_t{});
    case DType::UInt32: return f(uint32_t{});
    case DType::UInt64: return f(uint64_t{});
    case DType::Bool: return f(bool{});
    default: fail(what, "cannot convert " + dtype_name(t) + " (numeric types only)");
  }
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Tensor read_npy(const std::filesystem::path& path) { return parse_npy(read_all(path), path.string()); }

Dataset read_npz(const std::filesystem::path& path) {
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_RDONLY, &err);
  if (!z) {
    if (!std::filesystem::exists(path)) fail(path.string(), "cannot open the file");
    zip_error_t e;
    zip_error_init_with_code(&e, err);
    std::string msg = zip_error_strerror(&e);
    zip_error_fini(&e);
    fail(path.string(), "not a readable .npz (zip) archive: " + msg);
  }
  std::unique_ptr<zip_t, void (*)(zip_t*)> close(z, [](zip_t* p) { zip_discard(p); });
  Dataset out;
  const zip_int64_t n = zip_get_num_entries(z, 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    if (zip_stat_index(z, i, 0, &st) != 0) fail(path.string(), "cannot read the archive's directory");
    std::string name = st.name;
    const std::string where = path.string() + ":" + name;
    if (name.size() < 4 || name.substr(name.size() - 4) != ".npy") continue;
    zip_file_t* f = zip_fopen_index(z, i, 0);
    if (!f) fail(where, std::string("cannot open the entry: ") + zip_strerror(z));
    std::string bytes(st.size, '\0');
    const zip_int64_t got = zip_fread(f, bytes.data(), st.size);
    zip_fclose(f);
    if (got < 0 || static_cast<zip_uint64_t>(got) != st.size) fail(where, "the entry is truncated or corrupt");
    out[name.substr(0, name.size() - 4)] = parse_npy(bytes, where);
  }
  if (out.empty()) fail(path.string(), "the archive holds no .npy arrays");
  return out;
}

Dataset read_csv(const std::filesystem::path& path, const CsvOptions& opts) {
  std::ifstream f(path);
  if (!f) fail(path.string(), "cannot open the file");
  std::vector<std::string> names;
  std::vector<std::vector<double>> cols;
  std::string line;
  int64_t lineno = 0;
  auto split = [&](const std::string& l) {
    std::vector<std::string> fields;
    std::string cur;
    bool quoted = false;
    for (char c : l) {
      if (c == '"') quoted = !quoted;
      else if (c == opts.delimiter && !quoted) {
        fields.push_back(cur);
        cur.clear();
      } else if (c != '\r') cur += c;
    }
    fields.push_back(cur);
    for (std::string& s : fields) {
      size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
      s = b == std::string::npos ? "" : s.substr(b, e - b + 1);
    }
    return fields;
  };
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
    std::vector<std::string> fields = split(line);
    if (names.empty()) {
      if (opts.header) {
        names = fields;
        cols.resize(names.size());
        continue;
      }
      for (size_t i = 0; i < fields.size(); ++i) names.push_back(std::to_string(i));
      cols.resize(names.size());
    }
    const std::string where = path.string() + ":" + std::to_string(lineno);
    if (fields.size() != names.size())
      fail(where, "expected " + std::to_string(names.size()) + " fields, found " + std::to_string(fields.size()));
    for (size_t i = 0; i < fields.size(); ++i) {
      const std::string& s = fields[i];
      char* end = nullptr;
      double v = std::strtod(s.c_str(), &end);
      if (s.empty() || *end != '\0')
        fail(where, "column '" + names[i] + "': expected a number, found '" + s + "'");
      cols[i].push_back(v);
    }
  }
  if (names.empty()) fail(path.string(), "the file is empty");
  Dataset out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (out.count(names[i])) fail(path.string(), "column '" + names[i] + "' appears twice in the header");
    out[names[i]] = Tensor::from_vector<double>({static_cast<int64_t>(cols[i].size())}, cols[i]);
  }
  return out;
}

Dataset read_data_file(const std::filesystem::path& path, const CsvOptions& csv) {
  const std::string ext = lower(path.extension().string());
  if (ext == ".npy") return {{path.stem().string(), read_npy(path)}};
  if (ext == ".npz") return read_npz(path);
  if (ext == ".csv" || ext == ".tsv" || ext == ".txt") return read_csv(path, csv);
  fail(path.string(), "unknown data file type '" + ext + "'; expected .npy, .npz or .csv");
}

Tensor convert(const Tensor& t, DType to) {
  if (t.dtype == to) return t.clone();
  Tensor out = Tensor::empty(to, t.shape);
  with_type(t.dtype, "convert", [&](auto from) {
    using S = decltype(from);
    with_type(to, "convert", [&](auto dst) {
      using D = decltype(dst);
      const S* s = t.ptr<S>();
      D* d = out.ptr<D>();
      for (int64_t i = 0, n = t.numel(); i < n; ++i) d[i] = static_cast<D>(s[i]);
    });
  });
  return out;
}

Tensor slice_rows(const Tensor& t, int64_t begin, int64_t end) {
  if (t.rank() == 0 || begin < 0 || end > t.shape[0] || begin > end)
    fail("slice_rows", "rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + t.describe());
  std::vector<int64_t> shape = t.shape;
  shape[0] = end - begin;
  Tensor out = Tensor::empty(t.dtype, shape);
  const size_t row = t.shape[0] ? t.nbytes() / t.shape[0] : 0;
  std::memcpy(out.data, static_cast<const char*>(t.data) + begin * row, out.nbytes());
  return out;
}

void gather_rows(const Tensor& t, std::span<const int64_t> rows, Tensor& out) {
  const size_t row = t.shape[0] ? t.nbytes() / t.shape[0] : 0;
  const char* src = static_cast<const char*>(t.data);
  char* dst = static_cast<char*>(out.data);
  for (size_t i = 0; i < rows.size(); ++i) std::memcpy(dst + i * row, src + rows[i] * row, row);
}

RandomSampler::RandomSampler(int64_t size, bool shuffle, uint64_t seed, int rank, int world_size)
    : size_(size), shuffle_(shuffle), seed_(seed), rank_(rank), world_(world_size) {
  DistributedSampler check(size, rank, world_size);  // validates size, rank and world size
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  SamplerOptions o;
  o.shuffle = shuffle_;
  o.seed = seed_;
  DistributedSampler d(size_, rank_, world_, o);
  d.set_epoch(epoch);
  return world_ == 1 ? d.permutation() : d.indices();
}

DataLoader::DataLoader(std::map<std::string, Tensor> feeds, int64_t batch_size, std::shared_ptr<Sampler> sampler,
                       bool drop_last)
    : arrays_(std::move(feeds)), batch_size_(batch_size), sampler_(std::move(sampler)), drop_last_(drop_last) {
  if (arrays_.empty()) fail("data", "no arrays to load");
  if (batch_size_ < 1) fail("batch_size", "expected an integer >= 1, got " + std::to_string(batch_size_));
  std::string first;
  for (const auto& [name, t] : arrays_) {
    if (t.rank() == 0) fail("data '" + name + "'", "is a scalar; expected one row per sample");
    if (first.empty()) {
      first = name;
      rows_ = t.shape[0];
    } else if (t.shape[0] != rows_) {
      fail("data '" + name + "'", "has " + std::to_string(t.shape[0]) + " rows but '" + first + "' has " +
                                      std::to_string(rows_) + "; every array needs one row per sample");
    }
  }
  if (rows_ == 0) fail("data", "has no samples");
  if (!sampler_) sampler_ = std::make_shared<RandomSampler>(rows_, false, 0);
  for (const auto& [name, t] : arrays_) {
    std::vector<int64_t> shape = t.shape;
    shape[0] = batch_size_;
    buffers_[name] = Tensor::empty(t.dtype, shape);
  }
  start_epoch(0);
  if (batches_per_epoch() == 0)
    fail("data", std::to_string(order_.size()) + " samples make no full batch of " + std::to_string(batch_size_) +
                     " with drop_last");
}

int64_t DataLoader::batches_per_epoch() const {
  const int64_t n = static_cast<int64_t>(order_.size());
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

void DataLoader::start_epoch(int64_t epoch) {
  if (epoch == epoch_) return;
  order_ = sampler_->indices(epoch);
  for (int64_t i : order_)
    if (i < 0 || i >= rows_) fail("sampler", "index " + std::to_string(i) + " is outside the data's rows");
  epoch_ = epoch;
}

const Feeds& DataLoader::batch(int64_t b) {
  if (b < 0 || b >= batches_per_epoch())
    fail("batch", std::to_string(b) + " is outside the epoch's " + std::to_string(batches_per_epoch()) + " batches");
  const int64_t begin = b * batch_size_;
  const int64_t n = std::min<int64_t>(batch_size_, static_cast<int64_t>(order_.size()) - begin);
  std::span<const int64_t> rows(order_.data() + begin, static_cast<size_t>(n));
  for (auto& [name, buf] : buffers_) {
    std::vector<int64_t> shape = buf.shape;
    shape[0] = n;
    Tensor view = Tensor::view(buf.dtype, shape, buf.data);
    gather_rows(arrays_.at(name), rows, view);
    current_[name] = view;
  }
  return current_;
}

}  // namespace onnxtrain
