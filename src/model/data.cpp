#include "model/data.hpp"

#include <cstdio>
#include <filesystem>
#include <span>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "shard/partition.hpp"
#include "io/h5_checkpoint.hpp"

namespace ctxpar {

int32_t synthetic_successor(int32_t prev, int64_t V) { return int32_t((int64_t(prev) * 5 + 3) % V); }

namespace {

bool ends_with(const std::string& s, const char* suf) {
  const std::string t(suf);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

class SyntheticSource final : public TokenSource {
 public:
  SyntheticSource(const Config& c)
      : seed_(uint64_t(c.seed)), V_(c.vocab), docs_(c.docs), doc_mean_(c.doc_mean) {}
  void sample(int64_t index, int64_t S, int32_t* tokens, int32_t* doc_ids) const override {
    const uint64_t key = splitmix64(splitmix64(seed_ ^ 0x5eed0da7aull) + uint64_t(index));
    std::vector<int32_t> ids;
    // Documents: the `docs` setting, with random lengths drawn per sample.
    const std::string err = parse_docs(docs_, S, doc_mean_, key, ids);
    CTXPAR_CHECK(err.empty(), "docs: " << err);
    for (int64_t t = 0; t < S; ++t) {
      doc_ids[t] = ids.empty() ? 0 : ids[size_t(t)];
      const uint64_t h = splitmix64(key + 0x9e3779b97f4a7c15ull * uint64_t(t + 1));
      const bool start = t == 0 || doc_ids[t] != doc_ids[t - 1];
      const int32_t rnd = int32_t((h >> 8) % uint64_t(V_));
      tokens[t] = start || (h & 3) == 0 ? rnd : synthetic_successor(tokens[t - 1], V_);
    }
  }
  std::string describe() const override { return "synthetic (bigram rule, docs=" + docs_ + ")"; }

 private:
  uint64_t seed_;
  int64_t V_;
  std::string docs_;
  int64_t doc_mean_;
};

// Token files: sample i is the window [(i mod n) S, (i mod n + 1) S) with n = N / S full windows;
// a document ends after each eos_id token.
class FileSource final : public TokenSource {
 public:
  FileSource(const Config& c) : path_(c.data), u32_(c.data_dtype == TokenType::uint32), eos_(c.eos_id), V_(c.vocab) {
    hdf5_ = ends_with(path_, ".h5") || ends_with(path_, ".hdf5");
    n_tokens_ = hdf5_ ? h5_token_count(path_) : int64_t(std::filesystem::file_size(path_)) / (u32_ ? 4 : 2);
  }
  // The raw token ids of sample `index`'s window; returns its first token's index in the file.
  int64_t read(int64_t index, int64_t S, int32_t* tokens) const {
    const int64_t windows = n_tokens_ / S;
    const int64_t first = (index % windows) * S;
    if (hdf5_) {
      h5_read_tokens(path_, first, S, tokens);
    } else {
      std::FILE* f = std::fopen(path_.c_str(), "rb");
      CTXPAR_CHECK(f, "cannot open token file " << path_);
      const size_t w = u32_ ? 4 : 2;
      std::vector<unsigned char> raw(size_t(S) * w);
      CTXPAR_CHECK(std::fseek(f, long(first * int64_t(w)), SEEK_SET) == 0 && std::fread(raw.data(), w, size_t(S), f) == size_t(S),
                   "short read of " << S << " tokens at token " << first << " from " << path_);
      std::fclose(f);
      for (int64_t t = 0; t < S; ++t) {
        const unsigned char* p = raw.data() + size_t(t) * w;  // little-endian on disk
        tokens[t] = u32_ ? int32_t(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24)
                         : int32_t(uint32_t(p[0]) | uint32_t(p[1]) << 8);
      }
    }
    return first;
  }
  int64_t windows(int64_t S) const { return n_tokens_ / S; }
  // "" when every token of sample `index`'s window is in [0, vocab), else the first that is not.
  std::string check(int64_t index, int64_t S) const {
    std::vector<int64_t> ids(static_cast<size_t>(S));
    int64_t first = 0;
    if (hdf5_) {  // as int64: an HDF5 id beyond int32 would clamp in the int32 read
      first = (index % windows(S)) * S;
      h5_read_tokens_i64(path_, first, S, ids.data());
    } else {
      std::vector<int32_t> tokens(static_cast<size_t>(S));
      first = read(index, S, tokens.data());
      for (int64_t t = 0; t < S; ++t)
        ids[size_t(t)] = u32_ ? int64_t(uint32_t(tokens[size_t(t)])) : int64_t(tokens[size_t(t)]);
    }
    for (int64_t t = 0; t < S; ++t)
      if (ids[size_t(t)] < 0 || ids[size_t(t)] >= V_) {
        const int64_t id = ids[size_t(t)];
        return "token id " + std::to_string(id) + " at token " + std::to_string(first + t) +
               " is outside the vocabulary [0, " + std::to_string(V_) + "); valid: vocab > " + std::to_string(id) +
               " (the model's), or a token file written for this vocabulary";
      }
    return "";
  }
  void sample(int64_t index, int64_t S, int32_t* tokens, int32_t* doc_ids) const override {
    const int64_t first = read(index, S, tokens);
    int32_t d = 0;
    for (int64_t t = 0; t < S; ++t) {
      CTXPAR_CHECK(tokens[t] >= 0 && tokens[t] < V_, "token " << tokens[t] << " at index " << first + t << " of "
                                                                << path_ << " is outside the vocabulary [0, " << V_ << ")");
      doc_ids[t] = d;
      if (eos_ >= 0 && tokens[t] == eos_) ++d;
    }
  }
  std::string describe() const override {
    return path_ + " (" + std::to_string(n_tokens_) + " tokens" + (eos_ >= 0 ? ", eos " + std::to_string(eos_) : "") + ")";
  }

 private:
  std::string path_;
  bool u32_, hdf5_ = false;
  int64_t eos_, V_, n_tokens_ = 0;
};

}  // namespace

std::string validate_data(const Config& c) {
  if (synthetic_data(c)) return "";
  if (c.eos_id >= c.vocab)
    return "config: eos_id = " + std::to_string(c.eos_id) + " is not a token of the vocabulary [0, " +
           std::to_string(c.vocab) + "); valid: -1 (no document boundaries) or an id below vocab";
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(c.data, ec))
    return "config: data = '" + c.data + "' is neither 'synthetic' nor a readable token file";
  int64_t n = 0;
  if (ends_with(c.data, ".h5") || ends_with(c.data, ".hdf5")) {
    std::string err = h5_check_tokens(c.data, n);
    if (!err.empty()) return "config: data = '" + c.data + "': " + err;
  } else {
    const int64_t bytes = int64_t(fs::file_size(c.data, ec));
    const int64_t w = c.data_dtype == TokenType::uint32 ? 4 : 2;
    if (bytes % w != 0)
      return "config: data = '" + c.data + "' has " + std::to_string(bytes) + " bytes, not a whole number of " +
             name_of(c.data_dtype) + " tokens; valid: data_dtype matching the file";
    n = bytes / w;
  }
  if (n == 0) return "config: data = '" + c.data + "' holds no tokens; valid: a token file with at least seq tokens";
  if (n < c.seq)
    return "config: data = '" + c.data + "' has " + std::to_string(n) + " tokens, fewer than seq = " +
           std::to_string(c.seq) + "; valid: seq <= " + std::to_string(n);
  return "";
}

std::string check_data_tokens(const Config& c, int64_t first_sample, int64_t n_samples, int rank, int nranks) {
  if (synthetic_data(c) || n_samples <= 0) return "";
  const FileSource src(c);
  // Samples map onto windows modulo their count: at most every window once.
  const int64_t n = std::min(n_samples, src.windows(c.seq));
  for (int64_t i = rank; i < n; i += nranks) {
    const std::string err = src.check(first_sample + i, c.seq);
    if (!err.empty()) return "config: data = '" + c.data + "': " + err;
  }
  return "";
}

std::unique_ptr<TokenSource> make_token_source(const Config& c) {
  if (synthetic_data(c)) return std::make_unique<SyntheticSource>(c);
  return std::make_unique<FileSource>(c);
}

Batch make_batch(const TokenSource& src, int64_t index, int64_t S, const Partition& part, int r) {
  std::vector<int32_t> tokens(static_cast<size_t>(S)), doc(static_cast<size_t>(S));
  src.sample(index, S, tokens.data(), doc.data());
  const std::vector<int32_t> labels = shift_labels(std::span<const int32_t>(tokens), std::span<const int32_t>(doc));
  Batch b;
  b.S = S;
  b.pos = part.positions(r);
  const size_t n = b.pos.size();
  b.tokens.resize(n);
  b.labels.resize(n);
  b.doc.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t g = size_t(b.pos[i]);
    b.tokens[i] = tokens[g];
    b.labels[i] = labels[g];
    b.doc[i] = doc[g];
  }
  for (int32_t l : labels) b.labelled_tokens += l >= 0;
  b.documents = int64_t(doc.back()) + 1;
  b.doc_lengths.assign(size_t(b.documents), 0);
  for (int32_t d : doc) ++b.doc_lengths[size_t(d)];
  return b;
}

}  // namespace ctxpar
