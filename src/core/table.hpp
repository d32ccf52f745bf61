// A table of results as ctxpar prints it (the benches, predict): nccl-tests style, a two-row header
// (names, then units in parentheses), one row per case, notes above; or the same rows as CSV with
// the column names (units in the names).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace ctxpar {

struct TableColumn {
  std::string name;   // CSV column name, e.g. "fwd_gflops"
  std::string title;  // table header, e.g. "fwd"
  std::string unit;   // table second header row, e.g. "GFLOP/s"
  int width = 10;
  int precision = 2;  // for numeric cells
};

class Table {
 public:
  Table(std::string title, std::vector<TableColumn> cols, std::vector<std::string> notes);
  // Cells as text (use cell() to format numbers with the column's precision).
  void add_row(std::vector<std::string> cells);
  std::string cell(size_t col, double v) const;
  // The run's settings every row shares (ranks, mesh, shape, dtype): CSV columns before the
  // table's own, on every row (values without commas); in the table, one note line.
  void set_context(std::vector<std::pair<std::string, std::string>> kv) { context_ = std::move(kv); }
  // Prints on rank 0 only (the caller checks); table or CSV.
  void print(bool csv) const;
  size_t rows() const { return rows_.size(); }

 private:
  std::string title_;
  std::vector<TableColumn> cols_;
  std::vector<std::string> notes_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::pair<std::string, std::string>> context_;
};

}  // namespace ctxpar
