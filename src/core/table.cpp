#include "core/table.hpp"

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

void Table::print(bool csv) const {
  std::ostringstream os;
  if (csv) {
    for (size_t i = 0; i < cols_.size(); ++i) os << (i ? "," : "") << cols_[i].name;
    os << "\n";
    for (const auto& r : rows_) {
      for (size_t i = 0; i < r.size(); ++i) os << (i ? "," : "") << r[i];
      os << "\n";
    }
  } else {
    os << "# " << title_ << "\n";
    for (const std::string& n : notes_) os << "# " << n << "\n";
    os << "#";
    for (const auto& c : cols_) os << std::setw(c.width) << c.title;
    os << "\n#";
    for (const auto& c : cols_) os << std::setw(c.width) << (c.unit.empty() ? std::string() : "(" + c.unit + ")");
    os << "\n";
    for (const auto& r : rows_) {
      os << " ";
      for (size_t i = 0; i < r.size(); ++i) os << std::setw(cols_[i].width) << r[i];
      os << "\n";
    }
  }
  log0("%s", os.str().c_str());
}

}  // namespace ctxpar
