#include "core/table.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "core/error.hpp"
#include "core/log.hpp"

namespace ctxpar {

Table::Table(std::string title, std::vector<TableColumn> cols, std::vector<std::string> notes)
    : title_(std::move(title)), cols_(std::move(cols)), notes_(std::move(notes)) {}

void Table::add_row(std::vector<std::string> cells) {
  CTXPAR_CHECK(cells.size() == cols_.size(), "bench row has " << cells.size() << " cells, table has " << cols_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::cell(size_t col, double v) const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(cols_.at(col).precision) << v;
  return os.str();
}

namespace {

// A CSV field (RFC 4180): quoted, its quotes doubled, when it holds a comma or a quote.
std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

void Table::print(bool csv) const {
  std::ostringstream os;
  if (csv) {
    for (const auto& [k, v] : context_) os << k << ",";
    for (size_t i = 0; i < cols_.size(); ++i) os << (i ? "," : "") << cols_[i].name;
    os << "\n";
    for (const auto& r : rows_) {
      for (const auto& [k, v] : context_) os << csv_field(v) << ",";
      for (size_t i = 0; i < r.size(); ++i) os << (i ? "," : "") << csv_field(r[i]);
      os << "\n";
    }
  } else {
    // Each column at least its stated width, and one space wider than its title, its unit and
    // every cell: neighbouring headers, units and values never touch.
    std::vector<int> w(cols_.size());
    for (size_t i = 0; i < cols_.size(); ++i) {
      size_t need = std::max(cols_[i].title.size(), cols_[i].unit.empty() ? 0 : cols_[i].unit.size() + 2);
      for (const auto& r : rows_) need = std::max(need, r[i].size());
      w[i] = std::max(cols_[i].width, int(need) + 1);
    }
    os << "# " << title_ << "\n";
    for (const std::string& n : notes_) os << "# " << n << "\n";
    if (!context_.empty()) {
      os << "# run:";
      for (const auto& [k, v] : context_) os << " " << k << "=" << v;
      os << "\n";
    }
    os << "#";
    for (size_t i = 0; i < cols_.size(); ++i) os << std::setw(w[i]) << cols_[i].title;
    os << "\n#";
    for (size_t i = 0; i < cols_.size(); ++i)
      os << std::setw(w[i]) << (cols_[i].unit.empty() ? std::string() : "(" + cols_[i].unit + ")");
    os << "\n";
    for (const auto& r : rows_) {
      os << " ";
      for (size_t i = 0; i < r.size(); ++i) os << std::setw(w[i]) << r[i];
      os << "\n";
    }
  }
  log0("%s", os.str().c_str());
}

}  // namespace ctxpar
