#include "launch/bench/result_table.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_format.h"
#include "core/status.h"

namespace dcp::bench {
namespace {

// RFC 4180: quote a cell holding a separator, a quote or a line break.
std::string CsvCell(const std::string& cell) {
  if (cell.find_first_of(",\"\n") == std::string::npos) return cell;
  std::string quoted = "\"";
  for (char c : cell) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void ResultTable::AddRow(std::vector<std::string> cells) {
  if (cells.size() != columns_.size()) {
    std::fprintf(stderr, "dcp_bench: internal error: row of %zu cells for %zu columns\n",
                 cells.size(), columns_.size());
    std::abort();
  }
  if (progress_ != nullptr) {
    std::string line = "dcp_bench: [" + label_;
    if (expected_rows_ > 0) {
      const int64_t done = int64_t(rows_.size()) + 1;
      const double elapsed = NowSeconds() - started_s_;
      const double left = elapsed / double(done) * double(std::max<int64_t>(0, expected_rows_ - done));
      line += absl::StrFormat(" %d/%d, %s left", done, expected_rows_, FormatDuration(left));
    } else {
      line += absl::StrFormat(" %d", rows_.size() + 1);
    }
    line += "]";
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (!columns_[c].header.empty()) line += " " + cells[c];
    }
    std::fprintf(progress_, "%s\n", line.c_str());
    std::fflush(progress_);
  }
  if (stream_) {
    WriteCsvRow(*stream_, cells);
    stream_->flush();
  }
  rows_.push_back(std::move(cells));
}

void ResultTable::ExpectRows(int64_t total) {
  expected_rows_ = total;
  started_s_ = NowSeconds();
}

std::string FormatDuration(double seconds) {
  const int64_t s = seconds > 0 && std::isfinite(seconds) ? int64_t(seconds + 0.5) : 0;
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

absl::Status ResultTable::StreamTo(std::FILE* progress, const std::string& csv_path,
                                   const std::string& label) {
  progress_ = progress;
  label_ = label;
  stream_.reset();
  if (csv_path.empty()) return absl::OkStatus();
  const std::filesystem::path parent = std::filesystem::path(csv_path).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  auto file = std::make_unique<std::ofstream>(csv_path, std::ios::trunc);
  if (!*file) return DCP_ERROR(FailedPrecondition, "cannot open '%s' for writing", csv_path);
  std::vector<std::string> header;
  for (const Column& column : columns_) header.push_back(column.csv_name);
  WriteCsvRow(*file, header);
  file->flush();
  stream_ = std::move(file);
  return absl::OkStatus();
}

void ResultTable::WriteCsvRow(std::ostream& out, const std::vector<std::string>& cells) const {
  for (size_t c = 0; c < cells.size(); ++c) {
    // "-" means not applicable: an empty CSV field reads as missing in pandas.
    out << (c ? "," : "") << (cells[c] == "-" ? "" : CsvCell(cells[c]));
  }
  out << "\n";
}

void ResultTable::Print(std::FILE* out) const {
  std::vector<size_t> shown;
  for (size_t c = 0; c < columns_.size(); ++c) {
    if (!columns_[c].header.empty()) shown.push_back(c);
  }
  std::vector<size_t> width(columns_.size(), 0);
  for (size_t c : shown) {
    width[c] = columns_[c].header.size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  // The first column (the name of the row) is left-aligned, numbers right-aligned.
  auto print_line = [&](auto cell_of, const char* lead) {
    std::string line = lead;
    for (size_t i = 0; i < shown.size(); ++i) {
      const size_t c = shown[i];
      const std::string& cell = cell_of(c);
      line += i == 0 ? absl::StrFormat("%-*s", width[c], cell)
                     : absl::StrFormat("  %*s", width[c], cell);
    }
    std::fprintf(out, "%s\n", line.c_str());
  };
  print_line([&](size_t c) -> const std::string& { return columns_[c].header; }, "# ");
  for (const auto& row : rows_) {
    print_line([&](size_t c) -> const std::string& { return row[c]; }, "  ");
  }
  for (const std::string& note : notes_) std::fprintf(out, "# %s\n", note.c_str());
  std::fflush(out);
}

absl::Status ResultTable::WriteCsv(const std::string& path) const {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  std::ofstream file(path, std::ios::trunc);
  if (!file) return DCP_ERROR(FailedPrecondition, "cannot open '%s' for writing", path);
  std::vector<std::string> header;
  for (const Column& column : columns_) header.push_back(column.csv_name);
  WriteCsvRow(file, header);
  for (const auto& row : rows_) WriteCsvRow(file, row);
  file.close();
  if (!file) return DCP_ERROR(DataLoss, "writing '%s' failed", path);
  return absl::OkStatus();
}

std::string FormatFixed(double value, int decimals) {
  if (std::isnan(value)) return "-";
  return absl::StrFormat("%.*f", decimals, value);
}

std::string FormatSig(double value) {
  if (std::isnan(value)) return "-";
  if (value == 0) return "0";
  const double magnitude = std::fabs(value);
  if (magnitude >= 1e6 || magnitude < 1e-3) return absl::StrFormat("%.2e", value);
  const int decimals = magnitude >= 100 ? 0 : magnitude >= 10 ? 1 : magnitude >= 1 ? 2 : 3;
  return absl::StrFormat("%.*f", decimals, value);
}

std::string FormatInt(int64_t value) { return absl::StrFormat("%d", value); }

std::string FormatBytes(int64_t bytes) {
  if (bytes > 0 && bytes % (int64_t{1} << 30) == 0) return absl::StrFormat("%dG", bytes >> 30);
  if (bytes > 0 && bytes % (int64_t{1} << 20) == 0) return absl::StrFormat("%dM", bytes >> 20);
  if (bytes > 0 && bytes % (int64_t{1} << 10) == 0) return absl::StrFormat("%dK", bytes >> 10);
  return FormatInt(bytes);
}

}  // namespace dcp::bench
