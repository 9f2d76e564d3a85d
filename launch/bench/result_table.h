// Results of one mode as rows of text cells: printed as an aligned table (nccl-tests style, on
// rank 0) and written as CSV. A column may be CSV-only (run metadata, per-phase detail) so the
// terminal table stays narrow while the CSV keeps everything the plots and peers need.
#pragma once

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dcp::bench {

struct Column {
  std::string csv_name;  // the CSV header
  std::string header;    // the table header; empty: CSV only
};

class ResultTable {
 public:
  explicit ResultTable(std::vector<Column> columns) : columns_(std::move(columns)) {}

  // cells.size() must equal the number of columns (checked; a mismatch is a bug).
  void AddRow(std::vector<std::string> cells);
  // A line printed under the table, prefixed "# ".
  void AddNote(std::string note) { notes_.push_back(std::move(note)); }
  bool empty() const { return rows_.empty(); }

  // From now on, each added row is also printed to `progress` (its table cells, one line;
  // may be null) and appended to the CSV at `csv_path` (may be empty), flushed at once, so a
  // run cut short still leaves the rows it measured.
  absl::Status StreamTo(std::FILE* progress, const std::string& csv_path, const std::string& label);
  // The number of rows the sweep will add: each progress line then shows "k/N" and an
  // estimate of the time left (from the mean time per row so far).
  void ExpectRows(int64_t total);

  void Print(std::FILE* out) const;
  absl::Status WriteCsv(const std::string& path) const;

 private:
  void WriteCsvRow(std::ostream& out, const std::vector<std::string>& cells) const;

  std::vector<Column> columns_;
  std::FILE* progress_ = nullptr;
  int64_t expected_rows_ = 0;
  double started_s_ = 0;  // steady clock at ExpectRows
  std::string label_;
  std::unique_ptr<std::ofstream> stream_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::string> notes_;
};

// "1:02:03" / "4:05" for a duration in seconds.
std::string FormatDuration(double seconds);

// Number formatting shared by the modes: "-" for NaN (not measured / not applicable).
std::string FormatFixed(double value, int decimals);
// Three significant digits in fixed notation for values >= 1e-3, else scientific.
std::string FormatSig(double value);
std::string FormatInt(int64_t value);
// 1073741824 -> "1G", 65536 -> "64K"; other values in bytes.
std::string FormatBytes(int64_t bytes);

}  // namespace dcp::bench
