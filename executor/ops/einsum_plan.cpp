// Einsum's plan (einsum_plan.h): one loop over every index of the equation, output indices outer and summed ones
// inner. An ellipsis becomes fresh indices aligned from the right, and a size-1 dim broadcasts (stride 0).
#include "executor/ops/einsum_plan.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <string>

#include "executor/ops/kernel_util.h"
#include "graph/einsum.h"
#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

EinsumPlan plan_einsum(const PrepareContext& ctx, std::vector<int64_t>& out_shape) {
  const EinsumEquation parsed = parse_einsum_equation(ctx.node.attr_string("equation", ""));
  const std::string& eq = parsed.text;
  if (eq.empty()) ctx.fail("attribute 'equation' is required");
  const std::vector<std::string>& terms = parsed.terms;
  if (terms.size() != ctx.inputs.size())
    ctx.fail("equation '" + eq + "' has " + std::to_string(terms.size()) + " operands but the node has " +
             std::to_string(ctx.inputs.size()) + " inputs");
  // Ellipsis dims are named by characters outside the letters: '0' + k counted from the right.
  int64_t ell_rank = 0;
  std::vector<std::vector<char>> labels(terms.size());
  for (size_t t = 0; t < terms.size(); ++t) {
    const KernelInput& in = required_input(ctx, t, "Inputs");
    const std::string& term = terms[t];
    const size_t dots = term.find("...");
    int64_t letters = 0;
    for (char ch : term)
      if (std::isalpha(static_cast<unsigned char>(ch))) ++letters;
      else if (ch != '.') ctx.fail("equation '" + eq + "' has an invalid character '" + std::string(1, ch) + "'");
    const auto rank = static_cast<int64_t>(in.shape.size());
    const int64_t e = dots == std::string::npos ? 0 : rank - letters;
    if (e < 0 || (dots == std::string::npos && letters != rank))
      ctx.fail("operand " + std::to_string(t) + " '" + term + "' does not match its rank " + std::to_string(rank));
    ell_rank = std::max(ell_rank, e);
    for (size_t i = 0; i < term.size(); ++i) {
      if (term[i] == '.') {
        if (i == dots)
          for (int64_t k = e; k-- > 0;) labels[t].push_back(static_cast<char>('0' + k));
        continue;
      }
      labels[t].push_back(term[i]);
    }
  }
  std::map<char, int64_t> size;
  for (size_t t = 0; t < terms.size(); ++t)
    for (size_t i = 0; i < labels[t].size(); ++i) {
      const int64_t d = ctx.inputs[t].shape[i];
      auto [it, fresh] = size.emplace(labels[t][i], d);
      if (!fresh && it->second != d) {
        if (it->second == 1) it->second = d;
        else if (d != 1)
          ctx.fail("index '" + std::string(1, labels[t][i]) + "' has sizes " + std::to_string(it->second) + " and " +
                   std::to_string(d));
      }
    }
  std::vector<char> out;
  {
    const std::string& rhs = parsed.output;  // the implicit output spelled out too
    for (size_t i = 0; i < rhs.size(); ++i) {
      if (rhs[i] == '.') {
        if (rhs.compare(i, 3, "...") != 0) ctx.fail("equation '" + eq + "' has a stray '.'");
        for (int64_t k = ell_rank; k-- > 0;) out.push_back(static_cast<char>('0' + k));
        i += 2;
        continue;
      }
      if (!size.count(rhs[i])) ctx.fail("output index '" + std::string(1, rhs[i]) + "' is not in any operand");
      if (std::find(out.begin(), out.end(), rhs[i]) != out.end())
        ctx.fail("output index '" + std::string(1, rhs[i]) + "' is repeated");
      out.push_back(rhs[i]);
    }
  }
  std::vector<char> summed;
  for (const auto& [ch, d] : size)
    if (std::find(out.begin(), out.end(), ch) == out.end()) summed.push_back(ch);
  EinsumPlan p;
  for (char ch : out) p.out_dims.push_back(size.at(ch));
  for (char ch : summed) p.sum_dims.push_back(size.at(ch));
  for (size_t t = 0; t < terms.size(); ++t) {
    const std::vector<int64_t> st = contiguous_strides(ctx.inputs[t].shape);
    // A label repeated within an operand (a diagonal) adds its strides.
    auto stride_of = [&](char ch) {
      int64_t s = 0;
      for (size_t i = 0; i < labels[t].size(); ++i)
        if (labels[t][i] == ch && ctx.inputs[t].shape[i] != 1) s += st[i];
      return s;
    };
    std::vector<int64_t> os, ss;
    for (char ch : out) os.push_back(stride_of(ch));
    for (char ch : summed) ss.push_back(stride_of(ch));
    p.out_strides.push_back(std::move(os));
    p.sum_strides.push_back(std::move(ss));
  }
  out_shape = p.out_dims;
  return p;
}

}  // namespace

EinsumPlan prepare_einsum(PrepareContext& ctx) {
  if (ctx.inputs.empty()) ctx.fail("needs at least one input");
  const DType t = required_input(ctx, 0, "Inputs").dtype;
  for (size_t i = 1; i < ctx.inputs.size(); ++i)
    if (required_input(ctx, i, "Inputs").dtype != t)
      ctx.fail("input " + std::to_string(i) + " has type " + dtype_name(ctx.inputs[i].dtype) + " but input 0 has " +
               dtype_name(t));
  std::vector<int64_t> shape;
  EinsumPlan p = plan_einsum(ctx, shape);
  set_output(ctx, 0, t, shape);
  return p;
}

}  // namespace onnxtrain::ops
