#include "graph/einsum.h"

#include <map>

namespace onnxtrain {

EinsumEquation parse_einsum_equation(const std::string& equation) {
  EinsumEquation e;
  for (char ch : equation)
    if (ch != ' ') e.text += ch;
  const size_t arrow = e.text.find("->");
  const std::string lhs = e.text.substr(0, arrow);
  for (size_t s = 0;;) {
    const size_t comma = lhs.find(',', s);
    e.terms.push_back(lhs.substr(s, comma == std::string::npos ? std::string::npos : comma - s));
    if (comma == std::string::npos) break;
    s = comma + 1;
  }
  e.explicit_output = arrow != std::string::npos;
  if (e.explicit_output) {
    e.output = e.text.substr(arrow + 2);
    return e;
  }
  std::map<char, int> uses;
  for (const std::string& t : e.terms)
    for (char ch : t)
      if (ch != '.') ++uses[ch];
  if (lhs.find("...") != std::string::npos) e.output = "...";
  for (const auto& [ch, n] : uses)
    if (n == 1) e.output += ch;
  return e;
}

}  // namespace onnxtrain
