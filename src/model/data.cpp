#include "model/data.hpp"

#include <cstdio>
#include <filesystem>
#include <span>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "shard/partition.hpp"
#include "shard/placement.hpp"
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
  // Raw token ids [first, first + count) of a raw file, as int64 (uint32 ids beyond int32 kept).
  void read_raw(int64_t first, int64_t count, int64_t* out) const {
    std::FILE* f = std::fopen(path_.c_str(), "rb");
    CTXPAR_CHECK(f, "cannot open token file " << path_);
    const size_t w = u32_ ? 4 : 2;
    std::vector<unsigned char> raw(size_t(count) * w);
    const bool ok = std::fseek(f, long(first * int64_t(w)), SEEK_SET) == 0 &&
                    std::fread(raw.data(), w, size_t(count), f) == size_t(count);
    std::fclose(f);
    CTXPAR_CHECK(ok, "short read of " << count << " tokens at token " << first << " from " << path_);
    for (int64_t t = 0; t < count; ++t) {
      const unsigned char* p = raw.data() + size_t(t) * w;  // little-endian on disk
      out[t] = u32_ ? int64_t(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24)
                    : int64_t(uint32_t(p[0]) | uint32_t(p[1]) << 8);
    }
  }
  // The raw token ids of sample `index`'s window; returns its first token's index in the file.
  int64_t read(int64_t index, int64_t S, int32_t* tokens) const {
    const int64_t windows = n_tokens_ / S;
    const int64_t first = (index % windows) * S;
    if (hdf5_) {
      h5_read_tokens(path_, first, S, tokens);
    } else {
      std::vector<int64_t> ids(static_cast<size_t>(S));
      read_raw(first, S, ids.data());
      for (int64_t t = 0; t < S; ++t) tokens[t] = int32_t(ids[size_t(t)]);  // ids >= 2^31 fail the vocab check
    }
    return first;
  }
  int64_t windows(int64_t S) const { return n_tokens_ / S; }
  // "" when every token id of [first, first + count) is in [0, vocab), else the first that is not.
  // Read as int64 (an HDF5 id beyond int32 would clamp in the int32 read); throws on I/O errors.
  std::string check_range(int64_t first, int64_t count) const {
    std::vector<int64_t> ids(static_cast<size_t>(count));
    if (hdf5_) h5_read_tokens_i64(path_, first, count, ids.data());
    else read_raw(first, count, ids.data());
    for (int64_t t = 0; t < count; ++t)
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
    for (int64_t t = 0; t < S; ++t)
      CTXPAR_CHECK(tokens[t] >= 0 && tokens[t] < V_, "token " << tokens[t] << " at index " << first + t << " of "
                                                                << path_ << " is outside the vocabulary [0, " << V_ << ")");
    document_ids(tokens, S, doc_ids);
  }
  // Sample `index`'s document ids without the vocabulary check (what predict places).
  void sample_documents(int64_t index, int64_t S, int32_t* doc_ids) const {
    std::vector<int32_t> tokens(static_cast<size_t>(S));
    read(index, S, tokens.data());
    document_ids(tokens.data(), S, doc_ids);
  }
  // A document ends after each eos_id token.
  void document_ids(const int32_t* tokens, int64_t S, int32_t* doc_ids) const {
    int32_t d = 0;
    for (int64_t t = 0; t < S; ++t) {
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
  // The windows the samples read (modulo their count): every window, or one or two contiguous
  // ranges of them; read in blocks of 1M tokens, block k on rank k mod nranks.
  const int64_t S = c.seq, W = src.windows(S);
  std::vector<std::pair<int64_t, int64_t>> ranges;  // tokens [begin, end)
  if (n_samples >= W) {
    ranges.push_back({0, W * S});
  } else {
    const int64_t a = first_sample % W, b = a + n_samples;
    ranges.push_back({a * S, std::min(b, W) * S});
    if (b > W) ranges.push_back({0, (b - W) * S});
  }
  constexpr int64_t kBlock = int64_t(1) << 20;
  int64_t k = 0;
  try {
    for (const auto& [begin, end] : ranges)
      for (int64_t t = begin; t < end; t += kBlock, ++k) {
        if (k % nranks != rank) continue;
        const std::string err = src.check_range(t, std::min(end, t + kBlock) - t);
        if (!err.empty()) return "config: data = '" + c.data + "': " + err;
      }
  } catch (const std::exception& e) {  // e.g. an HDF5 filter this library lacks
    return "config: data = '" + c.data + "': its tokens cannot be read (" + e.what() +
           "); valid: a raw token file, or an HDF5 dataset 'tokens' stored plain or with gzip";
  }
  return "";
}

std::unique_ptr<TokenSource> make_token_source(const Config& c) {
  if (synthetic_data(c)) return std::make_unique<SyntheticSource>(c);
  return std::make_unique<FileSource>(c);
}

int64_t token_windows(const Config& c) { return FileSource(c).windows(c.seq); }

std::vector<int64_t> sample_document_lengths(const Config& c, int64_t index) {
  std::vector<int32_t> doc(size_t(c.seq));
  FileSource(c).sample_documents(index, c.seq, doc.data());
  return document_lengths(doc);
}

Batch make_batch(const TokenSource& src, int64_t index, const Partition& part, int r, PlacementKind placement,
                 const PlacementPrice* price) {
  const int64_t S = part.S();  // the sequence's real tokens (the partition may add padding rows)
  std::vector<int32_t> tokens(static_cast<size_t>(S)), doc(static_cast<size_t>(S));
  src.sample(index, S, tokens.data(), doc.data());
  const std::vector<int32_t> labels = shift_labels(std::span<const int32_t>(tokens), std::span<const int32_t>(doc));
  Batch b;
  b.S = S;
  b.doc_lengths = document_lengths(doc);
  b.documents = int64_t(b.doc_lengths.size());
  CTXPAR_CHECK(placement != PlacementKind::automatic || price, "make_batch: placement = auto without a price");
  if (placement != PlacementKind::zigzag) {
    const PlacementKind kind = placement == PlacementKind::automatic ? PlacementKind::balanced : placement;
    Placement p = place_documents(kind, b.doc_lengths, part.P(), part.local_size(r));
    CTXPAR_CHECK(p.n == part.local_size(r), "make_batch: a placement of " << p.n << " rows per rank, the partition's "
                                                                          << part.local_size(r));
    b.placed = placement != PlacementKind::automatic ||
               (*price)(p, b.doc_lengths) < (*price)(zigzag_placement(b.doc_lengths, part.P()), b.doc_lengths);
    if (b.placed) b.pos = std::move(p.rows[size_t(r)]);
  }
  if (!b.placed) {
    b.pos = part.positions(r);
  }
  const size_t n = b.pos.size();
  b.tokens.resize(n);
  b.labels.resize(n);
  b.doc.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t g = size_t(b.pos[i]);
    if (part.is_pad(b.pos[i])) {  // a padding row (shard/partition.hpp): no label, no document
      b.tokens[i] = 0;
      b.labels[i] = -1;
      b.doc[i] = -1;
      continue;
    }
    b.tokens[i] = tokens[g];
    b.labels[i] = labels[g];
    b.doc[i] = doc[g];
  }
  for (int32_t l : labels) b.labelled_tokens += l >= 0;
  return b;
}

}  // namespace ctxpar
