// Training data: a seeded synthetic stream the model can learn, and token files (raw
// uint16/uint32 integers, or an HDF5 dataset "tokens"), packed into fixed-length sequences of S
// tokens with document boundaries (document ids feed the attention masks; labels never cross a
// document or a sequence end).
//
// Sample i of the stream is a pure function of (source, i): dp replica d at step s reads sample
// s * dp + d, so a restart needs only the step to continue the same data.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/settings.hpp"
#include "shard/placement.hpp"  // PlacementPrice

namespace ctxpar {

struct Config;
class Partition;

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes the S tokens of sample `index` and their document ids (0, 1, ... in order).
  virtual void sample(int64_t index, int64_t S, int32_t* tokens, int32_t* doc_ids) const = 0;
  virtual std::string describe() const = 0;
};

// "" when cfg.data names a usable source for seq and vocab (file exists, has >= seq tokens,
// dtype/dataset fit), else the message. Reads only the file's size / dataset shape.
std::string validate_data(const Config& cfg);
std::unique_ptr<TokenSource> make_token_source(const Config& cfg);
// Token files, before a run: "" when every token of the samples [first_sample, first_sample +
// n_samples) is inside [0, vocab), else the message naming the first id and where it is. Rank
// `rank` of `nranks` reads its share of the windows (every rank calls it; agree on the result).
std::string check_data_tokens(const Config& cfg, int64_t first_sample, int64_t n_samples, int rank, int nranks);

// Synthetic rule (documented for the oracle and tests): each document starts at a random token;
// each next token is succ(prev) = (prev * 5 + 3) mod V with probability 3/4, else a random token.
// A bigram model can reach about 0.75 ln(1/0.75) + 0.25 ln(4V) nats, far below ln V at start.
int32_t synthetic_successor(int32_t prev, int64_t V);

// The local part of one packed sequence for this CP rank.
struct Batch {
  int64_t S = 0;                  // global tokens of the sequence
  std::vector<int32_t> tokens;    // [S_loc]
  std::vector<int32_t> labels;    // [S_loc], -1 = no target (document or sequence end)
  std::vector<int64_t> pos;       // [S_loc] global positions
  std::vector<int32_t> doc;       // [S_loc] document ids (all 0 when the sequence is one document)
  int64_t labelled_tokens = 0;    // labels >= 0 in the whole sequence (all CP ranks)
  int64_t documents = 1;
  std::vector<int64_t> doc_lengths;  // of the whole sequence (FLOP count: sum L_i^2)
  bool placed = false;  // rows placed per batch from the documents (placement=balanced or auto's choice), not the partition's
};
// A token file's windows of seq tokens, and the document lengths of sample `index` (a document ends
// after each eos_id token, as make_batch cuts it), without the vocabulary check: what `predict`
// places (modes/predict.cpp). cfg.data must be a token file validate_data accepts.
int64_t token_windows(const Config& cfg);
std::vector<int64_t> sample_document_lengths(const Config& cfg, int64_t index);

// Reads sample `index`, shifts labels globally (shard/shift_labels) and keeps cp rank r's tokens:
// those of the partition, or with placement = balanced or document those the document lengths
// place on it (shard/placement.hpp; as many rows as the partition's, padding rows past S); with
// placement = auto the balanced placement where `price` says it is cheaper than the zigzag rows
// (strictly: a tie keeps zigzag), the same choice on every rank.
Batch make_batch(const TokenSource& src, int64_t index, const Partition& part, int r,
                 PlacementKind placement = PlacementKind::zigzag, const PlacementPrice* price = nullptr);

}  // namespace ctxpar
