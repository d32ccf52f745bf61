#include "modes/oracle_dump.hpp"

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/stats.hpp"
#include "dist/topology.hpp"
#include "io/h5_checkpoint.hpp"
#include "model/checkpoint.hpp"
#include "model/data.hpp"

namespace ctxpar {

OracleDump::OracleDump(const Config& cfg, const ParamLayout& layout, Topology& topo, bool from_step0)
    : cfg_(cfg), layout_(layout), topo_(topo), on_(!cfg.dump_init.empty() && from_step0), limit_(cfg.dump_steps) {}

void OracleDump::state(const float* params, const float* m, const float* v) {
  State s;
  s.p = gather_global_tensors(layout_, params, topo_);
  s.m = gather_global_tensors(layout_, m, topo_);
  s.v = gather_global_tensors(layout_, v, topo_);
  steps_.push_back(std::move(s));
}

void OracleDump::gradients(const float* grads) { steps_.back().g = gather_global_tensors(layout_, grads, topo_); }

double OracleDump::gather_bytes(const Config& cfg, double global_param_bytes) {
  const int64_t run = cfg.warmup + cfg.steps;
  const int64_t n = cfg.dump_steps > 0 ? std::min(cfg.dump_steps, run) : run;
  return double(4 * n + 3) * global_param_bytes + 4.0 * double(cfg.seq * cfg.vocab);
}

void OracleDump::write(const std::vector<double>& losses, const TokenSource& src) {
  Comm& world = topo_.world();
  run_then_agree(world, [&] {  // rank 0 writes; a fault there ends the run on every rank alike
    if (world.rank() != 0) return;
    std::vector<H5Tensor> t;
    const auto& info = layout_.tensors();
    for (size_t s = 0; s < steps_.size(); ++s) {
      const std::string dir = "steps/" + std::to_string(s) + "/";
      const State& st = steps_[s];
      for (size_t i = 0; i < info.size(); ++i) {
        t.push_back({dir + "params/" + info[i].name, info[i].rows, info[i].cols, st.p[i].data()});
        t.push_back({dir + "adam_m/" + info[i].name, info[i].rows, info[i].cols, st.m[i].data()});
        t.push_back({dir + "adam_v/" + info[i].name, info[i].rows, info[i].cols, st.v[i].data()});
        if (!st.g.empty()) t.push_back({dir + "grads/" + info[i].name, info[i].rows, info[i].cols, st.g[i].data()});
      }
    }
    t.push_back({"logits", cfg_.seq, layout_.dims().vocab, logits_.data()});
    std::vector<float> lossf(losses.begin(), losses.end());
    t.push_back({"losses", 1, int64_t(lossf.size()), lossf.data()});
    // The sample of every step run (dp = 1: step s reads sample s), [steps, S] flattened.
    const int64_t n_steps = int64_t(losses.size()), S = cfg_.seq;
    std::vector<int32_t> tokens(static_cast<size_t>(n_steps * S)), doc(static_cast<size_t>(n_steps * S));
    for (int64_t s = 0; s < n_steps; ++s) src.sample(s, S, tokens.data() + s * S, doc.data() + s * S);
    // Never a NaN or Inf in the dump unannounced (the oracle would compare against it).
    for (const H5Tensor& x : t)
      if (const std::string bad = first_non_finite(x.data, {x.rows, x.cols}); !bad.empty())
        throw LocalFault("oracle dump: tensor " + x.name + " has " + bad + " ([row, col]); " + cfg_.dump_init +
                         " not written");
    const Config& c = cfg_;
    H5Attrs a;
    a.ints = {{"layers", c.layers}, {"dim", c.dim}, {"ffn_dim", c.ffn_dim}, {"vocab", c.vocab}, {"heads", c.heads},
              {"kv_heads", c.kv_heads}, {"head_dim", c.head_dim}, {"seq", c.seq},
              {"rope_original_max_pos", c.rope_original_max_pos}, {"gdn_heads", c.gdn_heads},
              {"gdn_head_dim_k", c.gdn_head_dim_k}, {"gdn_head_dim_v", c.gdn_head_dim_v}, {"gdn_conv", c.gdn_conv},
              {"gdn_chunk", c.gdn_chunk}, {"window", c.window}, {"q_lora_rank", c.q_lora_rank},
              {"kv_lora_rank", c.kv_lora_rank}, {"qk_nope_head_dim", c.qk_nope_head_dim},
              {"qk_rope_head_dim", c.qk_rope_head_dim}, {"v_head_dim", c.v_head_dim},
              {"steps_recorded", int64_t(steps_.empty() ? 0 : steps_.size() - 1)}};
    a.doubles = {{"norm_eps", c.norm_eps}, {"rope_theta", c.rope_theta}, {"rope_scale_factor", c.rope_scale_factor},
                 {"rope_low_freq_factor", c.rope_low_freq_factor}, {"rope_high_freq_factor", c.rope_high_freq_factor},
                 {"lr", c.lr}, {"weight_decay", c.weight_decay}, {"beta1", c.beta1}, {"beta2", c.beta2},
                 {"adam_eps", c.adam_eps}, {"grad_clip", c.grad_clip}};
    a.strings = {{"ctxpar_file", "oracle_dump"}, {"layer_pattern", c.layer_pattern}, {"attention", c.attention}};
    h5_write_tensors(c.dump_init, a, t, {{"tokens", n_steps * S, tokens.data()}, {"doc_ids", n_steps * S, doc.data()}});
  });
}

}  // namespace ctxpar
