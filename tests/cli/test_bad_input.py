#!/usr/bin/env python3
"""Bad-input table: each case must print one clear message on rank 0, on stderr, that names the
field or value; exit with code 2 on every rank; finish within 30 s; and leave every file as it
was: nothing created, nothing changed (inputs, existing outputs, other runs' traces).

Two ways to run a case, the same checks on both:
- in one process (the default): every case's command line through the program's own start-up
  checks (src/app/startup.hpp, the function main.cpp calls) by tests/cli/check_inputs, one MPI job
  for the whole table at np 2; markers between the cases split its stdout and stderr per case;
- end to end (`mpirun -np 2 ctxpar ...`, one job per case): the cases refused only once the run
  has started (E2E: the output locks), and every SAMPLE-th case of the rest, so that the exit code
  and the streams of the real program are checked too.
Usage: test_bad_input.py CTXPAR_BINARY CHECK_INPUTS_BINARY REPO_ROOT [--table] [--all-e2e]
  (--table prints the cases and messages; --all-e2e runs every case end to end)"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

NP = 2
TIMEOUT_S = 30
# odls_base_sigkill_timeout=0: every rank of a refused run exits with 2 by itself; mpirun need not
# wait its default second (the SIGTERM to SIGKILL grace) for ranks that have already gone.
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
           OMPI_MCA_odls_base_sigkill_timeout="0")

INFER_MODEL = ["layers=2", "dim=64", "ffn_dim=128", "vocab=101", "heads=4", "kv_heads=2", "head_dim=16", "threads=1"]

# (name, arguments, text the message must contain). @X@ names a fixture file in the case's
# directory (see make_fixtures); @TMP@ is that directory; @TINY@ the tiny model's config.
CASES = [
    ("unknown key", ["run", "sequ=4K"], "sequ"),
    ("not an integer", ["run", "seq=abc"], "seq"),
    ("bad size suffix", ["run", "seq=12Q"], "seq"),
    ("out of range", ["run", "head_dim=512"], "head_dim"),
    ("unknown strategy", ["run", "strategy=spiral"], "strategy"),
    ("bad boolean", ["bench", "comm", "csv=maybe"], "csv"),
    ("bad float", ["run", "watchdog_s=fast"], "watchdog_s"),
    ("mesh product != ranks", ["run", "mesh=ring:3"], "mesh"),
    ("unknown mesh axis", ["run", "mesh=torus:2"], "mesh"),
    ("mesh with a trailing comma", ["run", "mesh=ring:2,"], "mesh"),
    ("mesh axis beyond any machine", ["run", "mesh=dp:6,ring:3074457345618258603"], "mesh"),
    ("predict_mesh axis of 0 names predict_mesh", ["predict", "predict_mesh=ring:0"], "predict_mesh ="),
    ("heads not a multiple of kv_heads", ["run", "heads=6", "kv_heads=4"], "kv_heads"),
    ("window without mask=window", ["run", "window=64"], "window"),
    ("mask=window without window", ["run", "mask=window"], "window"),
    ("seq of zero tokens", ["run", "seq=0"], "seq"),
    ("document lengths do not sum to seq", ["run", "seq=4K", "docs=100,200"], "docs"),
    ("document list with an empty item", ["run", "seq=4K", "docs=1K,,3K"], "docs"),
    ("schedule with a trailing comma", ["chat", "schedule=prefill:1K,decode:4,"], "schedule"),
    ("bench comm sizes reversed", ["bench", "comm", "bench_min_bytes=1M", "bench_max_bytes=4K"], "bench_min_bytes"),
    ("ulysses cannot split heads", ["run", "strategy=ulysses", "mesh=ulysses:2", "heads=3", "kv_heads=3"], "heads"),
    ("strategy=auto without a readable profile", ["train", "strategy=auto", "hardware=nope"], "hardware"),
    ("host offload on the CPU", ["train", "offload=optimizer"], "offload"),
    ("device=cuda for a mode not built for it", ["bench", "comm", "device=cuda"], "device"),
    ("attn device=cuda where no GPU is usable (or no CUDA build)", ["attn", "device=cuda", "seq=128"], "device"),
    ("frugal with device=cuda", ["attn", "device=cuda", "frugal=true", "seq=128"], "frugal"),
    ("MLA with device=cuda", ["bench", "cp", "attention=mla", "device=cuda", "seq=256"], "mla"),
    ("unknown layer kind in layer_pattern", ["train", "layer_pattern=DXG"], "layer_pattern"),
    ("empty layer_pattern", ["train", "layer_pattern="], "layer_pattern"),
    ("unknown GDN schedule", ["train", "layer_pattern=D", "gdn_schedule=tree"], "gdn_schedule"),
    ("GDN head dimension out of range", ["train", "layer_pattern=D", "gdn_head_dim_k=4096"], "gdn_head_dim_k"),
    ("unknown GDN state placement", ["chat", "layer_pattern=DG", "gdn_state=shared"], "gdn_state"),
    ("GDN layers with tensor parallelism", ["train", "mesh=tp:2", "layer_pattern=DG"], "layer_pattern"),
    ("GDN pieces shorter than the convolution's halo", ["train", "layer_pattern=D", "seq=8"], "gdn_conv"),
    ("GDN layers in bench infer (its saved cache holds no GDN state)", ["bench", "infer", "layer_pattern=DG"], "layer_pattern"),
    ("GDN layers priced for inference", ["predict", "layer_pattern=DG", "predict_mode=decode"], "layer_pattern"),
    ("local layers without a window", ["train", "layer_pattern=LG"], "window"),
    ("a window with neither mask=window nor local layers", ["train", "window=64"], "window = 64"),
    ("unknown local strategy", ["train", "layer_pattern=LG", "window=64", "local_strategy=tree"], "local_strategy"),
    ("unknown attention kind", ["train", "attention=gqa"], "attention"),
    # More threads than any CI machine's CPUs: time-sliced, every kernel barrier waits (3000x slower).
    ("threads beyond the CPUs", ["train", "threads=1024"], "CPU(s)"),
    ("OMP_NUM_THREADS beyond the CPUs", ["train", "ENV:OMP_NUM_THREADS=1024"], "OMP_NUM_THREADS = 1024"),
    ("batch in train", ["train", "batch=2"], "batch (command line) is not read by"),
    ("predict tp dividing no heads", ["predict", "predict_mesh=tp:3", "heads=8"], "tp:3 does not divide heads = 8"),
    ("vocab in attn", ["attn", "vocab=1000"], "vocab (command line) is not read by"),
    ("gdn_chunk in attn", ["attn", "gdn_chunk=64"], "gdn_chunk (command line) is not read by"),
    ("MLA head dim above the kernels' 256", ["train", "attention=mla", "qk_nope_head_dim=224", "qk_rope_head_dim=64"], "256"),
    ("MLA value dim above the key's", ["train", "attention=mla", "qk_nope_head_dim=16", "qk_rope_head_dim=8", "v_head_dim=32"], "v_head_dim"),
    ("MLA heads not split by tp", ["train", "attention=mla", "mesh=tp:2", "heads=3"], "tp:2 does not divide heads = 3"),
    ("MLA under ulysses (heads split, the latent is shared)", ["train", "attention=mla", "strategy=ulysses"],
     "ulysses: attention = mla"),
    ("MLA in an attention-only mode", ["run", "attention=mla"], "attention = mla applies to"),
    ("frugal with ulysses", ["train", "frugal=true", "strategy=ulysses"], "frugal = true"),
    ("bench cp frugal with usp", ["bench", "cp", "frugal=true", "strategy=usp"], "frugal = true"),
    ("frugal in prefill by pass-Q, which runs no prefill by pass-KV", ["prefill", "frugal=true", "cp_algo=pass_q"],
     "with cp_algo = pass_q no prefill runs by pass-KV"),
    ("frugal in chat with ulysses", ["chat", "frugal=true", "strategy=ulysses"], "frugal = true: strategy = ulysses"),
    ("frugal in decode with MLA", ["decode", "frugal=true", "attention=mla"], "frugal = true with attention = mla"),
    ("frugal in predict, which prices the plain schedules", ["predict", "frugal=true"], "frugal (command line) is not read by"),
    ("frugal with MLA", ["train", "frugal=true", "attention=mla"], "frugal = true with attention = mla"),
    ("balanced placement without the frugal exchange", ["train", "placement=balanced"], "placement = balanced needs frugal = true"),
    ("document placement without the frugal exchange", ["train", "placement=document"], "placement = document needs frugal = true"),
    ("document placement in chat, whose prompts are zigzag each on its own", ["chat", "placement=document", "frugal=true"],
     "placement = document applies to train, bench train and bench cp (inference already shards each sequence"),
    ("balanced placement in bench infer, whose table compares them", ["bench", "infer", "placement=balanced"],
     "placement (command line) is not read by"),
    ("balanced placement in chat without the frugal exchange", ["chat", "placement=balanced", "cp_algo=pass_kv"],
     "placement = balanced needs frugal = true"),
    ("balanced placement in chat with cp_algo=auto", ["chat", "placement=balanced", "frugal=true"],
     "cp_algo = auto may run it by pass-Q"),
    ("balanced placement in prefill with Gated DeltaNet layers",
     ["prefill", "placement=balanced", "frugal=true", "cp_algo=pass_kv", "layer_pattern=DG"],
     "holds Gated DeltaNet layers, whose state"),
    ("auto placement in chat", ["chat", "placement=auto", "frugal=true", "cp_algo=pass_kv"],
     "placement = auto applies to train and bench train"),
    ("balanced placement with Gated DeltaNet layers", ["train", "placement=balanced", "frugal=true", "layer_pattern=DG"],
     "Gated DeltaNet layers pass their state"),
    ("balanced placement with the halo for local layers",
     ["train", "placement=balanced", "frugal=true", "layer_pattern=LG", "window=16", "local_strategy=halo"],
     "placement = balanced with local_strategy = halo"),
    ("placement not one of its names", ["train", "placement=packed"], "zigzag, balanced, auto"),
    ("auto placement without the frugal exchange", ["train", "placement=auto"], "placement = auto needs frugal = true"),
    ("auto placement in bench cp", ["bench", "cp", "placement=auto", "frugal=true"],
     "placement = auto applies to train and bench train"),
    ("auto placement with a profile that is not there", ["train", "placement=auto", "frugal=true", "hardware=nosuch"],
     "placement = auto prices each batch's placements with a hardware profile"),
    ("sharded training state in an inference mode", ["prefill", "shard=optimizer"], "shard (command line) is not read by"),
    ("sharded training state from a config file in bench cp", ["bench", "cp", "--config", "@SHARDTOML@"],
     "shard = optimizer splits the training state"),
    ("shard level not one of its names", ["train", "shard=params3"], "none, optimizer, grads, params"),
    ("local strategy not in the registry", ["train", "local_strategy=pass_q"], "one of: halo, allgather"),
    ("deterministic in bench attn", ["bench", "attn", "deterministic=true"], "deterministic (command line) is not read by"),
    # Keys a mode does not read, on the command line: refused, naming the modes that read them.
    ("cp_algo in train", ["train", "cp_algo=pass_q"], "it applies to prefill, decode, chat, bench infer"),
    ("save_logits in train", ["train", "save_logits=true"], "save_logits (command line) is not read by `ctxpar train`"),
    ("resume in run", ["run", "resume=x.h5"], "resume (command line) is not read by `ctxpar run`"),
    ("checkpoint_every in predict", ["predict", "checkpoint_every=1"], "it applies to train, bench train"),
    ("frugal in bench infer", ["bench", "infer", "frugal=true"], "frugal (command line) is not read by `ctxpar bench infer`"),
    ("a default value of a key the mode does not read", ["bench", "peak", "--seed", "1234"], "seed (command line)"),
    ("deterministic training with K/V heads replicated over tp", ["train", "--config", "@TINY@", "deterministic=true",
                                                                   "kv_heads=1", "mesh=tp:2"], "deterministic = true with tp:2"),
    ("deterministic Gated DeltaNet layers with the scan schedule", ["train", "deterministic=true", "layer_pattern=DG",
                                                                     "gdn_schedule=scan"], "gdn_schedule = scan"),
    ("deterministic blocks that are not whole GDN chunks", ["train", "--config", "@TINY@", "deterministic=true",
                                                             "layer_pattern=DG", "gdn_chunk=256"], "gdn_chunk = 256"),
    ("deterministic_block not a multiple of the tile", ["train", "--config", "@TINY@", "deterministic=true", "deterministic_block=100"],
     "deterministic_block = 100"),
    ("deterministic_block without deterministic", ["train", "deterministic_block=192"], "deterministic_block = 192"),
    ("deterministic_heads without deterministic", ["train", "deterministic_heads=2"], "deterministic_heads = 2"),
    ("deterministic_heads not dividing a K/V group", ["train", "--config", "@TINY@", "deterministic=true",
                                                     "deterministic_heads=3"], "deterministic_heads = 3 does not divide"),
    ("deterministic_heads above MLA's one-head groups", ["train", "attention=mla", "deterministic=true",
                                                        "deterministic_heads=2"], "every head its own K and V"),
    ("deterministic ulysses: replicated K/V heads, parts of the whole group", ["train", "--config", "@TINY@",
     "deterministic=true", "strategy=ulysses", "mesh=ulysses:2", "kv_heads=1"], "valid: deterministic_heads=4"),
    ("deterministic with frugal", ["bench", "cp", "deterministic=true", "frugal=true"], "deterministic = true with frugal"),
    ("deterministic ulysses with replicated K/V heads", ["bench", "cp", "deterministic=true", "strategy=ulysses",
                                                        "heads=8", "kv_heads=1"], "replicated"),
    ("MLA inference with strategy=auto", ["chat", "attention=mla", "strategy=auto"], "absorbed form"),
    ("MLA's local layers under usp", ["train", "attention=mla", "layer_pattern=LG", "window=8", "local_strategy=usp"],
     "local_strategy = usp"),
    ("MLA inference, cp_algo=auto from a profile", ["chat", "attention=mla", "hardware=h100-gtt"], "measured rates only"),
    ("unknown mode", ["fly"], "mode"),
    ("unknown bench", ["bench", "warp"], "bench"),
    ("missing --config file", ["run", "--config", "does/not/exist.toml"], "config"),
    ("--config names a directory", ["run", "--config", "@TMP@"], "config"),
    ("--config= with no file name", ["run", "--config="], "config"),
    ("a second --config", ["run", "--config", "@GOODTOML@", "--config=@TINY@"], "--config given twice"),
    ("a binary file as --config", ["run", "--config", "@BINARY@"], "TOML"),
    ("peak_tflops_per_rank too small to mean anything", ["train", "peak_tflops_per_rank=1e-300"], "peak_tflops_per_rank"),
    ("TOML syntax error", ["run", "--config", "@BADTOML@"], "bad.toml"),
    ("TOML nested too deep", ["run", "--config", "@NESTTOML@"], "nested"),
    ("unknown key in TOML", ["run", "--config", "@UNKNOWNTOML@"], "colour"),
    ("out is a directory", ["run", "out=@TMP@"], "out"),
    ("out ends with a slash", ["run", "out=@TMP@/newdir/"], "directory"),
    ("out ends in .partial (another run's live file)", ["run", "out=@TMP@/x.h5.partial"], ".partial"),
    ("out with a control character", ["run", "out=@TMP@/a\nb.h5"], "control character"),
    ("out name too long for NAME.partial", ["run", "out=@TMP@/" + "a" * 250 + ".h5"], "characters"),
    ("a user's file where the lock goes", ["run", "out=@TMP@/user.h5"], "user.h5.lock"),
    ("two outputs spelled differently", ["train", "--config", "@TINY@", "checkpoint_every=1", "out=@TMP@/x1.h5",
                                         "checkpoint=@TMP@/./x1.h5"], "same file"),
    ("a later output that cannot be made leaves no directory", ["train", "out=@TMP@/newdir/o.h5", "checkpoint_every=1",
                                                             "checkpoint=/proc/ctxpar_ck.h5"], "checkpoint"),
    ("NAME.partial is a directory", ["run", "out=@TMP@/p.h5"], "directory"),
    ("attn input file missing", ["attn", "in=@TMP@/missing.h5", "out=@TMP@/res.h5"], "in"),
    ("attn seq beside an input file", ["attn", "in=@ATTN@", "seq=4096", "out=@TMP@/res.h5"], "seq (command line) is not read"),
    ("attn heads beside an input file", ["attn", "--in=@ATTN@", "--heads=4", "out=@TMP@/res.h5"], "heads (command line) is not read"),
    # Outputs that would overwrite an input or another output.
    ("out is the --config file", ["run", "--config", "@GOODTOML@", "out=@GOODTOML@"], "out"),
    ("attn results over their own input", ["attn", "in=@ATTN@", "out=@ATTN@"], "out"),
    ("checkpoint and out the same file", ["train", "--config", "@TINY@", "checkpoint_every=1",
                                          "checkpoint=@TMP@/x.h5", "out=@TMP@/x.h5"], "checkpoint"),
    ("dump_init over the resume checkpoint", ["train", "--config", "@TINY@", "resume=@CK@", "steps=4",
                                              "dump_init=@CK@"], "dump_init"),
    ("out over the resume checkpoint", ["train", "--config", "@TINY@", "resume=@CK@", "steps=4", "out=@CK@"], "resume"),
    # Existing files that are not this run's kind of output.
    ("out holds another mode's trace", ["predict", "out=@TRAINTRACE@"], "train"),
    ("out holds a checkpoint", ["run", "out=@CK@"], "checkpoint"),
    ("out is a file ctxpar did not write", ["run", "out=@NOTES@"], "did not write"),
    ("calibrate over a profile it did not write", ["bench", "calibrate", "hardware=@PROFILE@"], "hardware"),
    ("calibrate to a path without .toml", ["bench", "calibrate", "hardware=@TMP@/prof"], "hardware"),
    ("calibrate a model beyond the node", ["bench", "calibrate", "hardware=@TMP@/cal.toml", "dim=1M", "ffn_dim=4M",
                                           "vocab=1G"], "smaller model"),
    ("NaN in a hardware profile", ["predict", "hardware=@HWNAN@"], "intra_latency_us"),
    ("predict sweep value the command line refuses", ["predict", "sweep=window=5,6"], "window"),
    # Memory: the plan against what a rank may use (mem_per_rank, or the node's).
    ("plan beyond mem_per_rank", ["train", "--config", "@TINY@", "mem_per_rank=1M"], "mem_per_rank"),
    ("plan beyond the node", ["train", "--config", "@TINY@", "seq=1G"], "seq <="),
    ("random documents over a huge seq, refused in time", ["train", "--config", "@TINY@", "seq=1T"], "seq <="),
    ("bench comm messages beyond mem_per_rank", ["bench", "comm", "bench_max_bytes=1G", "mem_per_rank=1G"],
     "bench_max_bytes <="),
    # Non-finite values and out-of-range ids, found when the files are checked, not absorbed.
    ("NaN in an attn input", ["attn", "in=@ATTNNAN@", "out=@TMP@/r.h5"], "nan at"),
    ("array attribute in an attn input", ["attn", "in=@ATTNARR@", "out=@TMP@/r.h5"], "single value"),
    ("attn input beyond mem_per_rank, refused before its values are read",
     ["attn", "in=@ATTNBIG@", "out=@TMP@/r.h5", "mem_per_rank=64M"], "attn plan needs"),
    ("checkpoint without next_sample", ["train", "--config", "@TINY@", "resume=@CKNONEXT@", "steps=4"], "next_sample"),
    ("Inf in a checkpoint", ["train", "--config", "@TINY@", "resume=@CKINF@", "steps=4"], "inf at"),
    ("resume past the last step", ["train", "--config", "@TINY@", "resume=@CK@", "steps=1", "warmup=0"], "steps"),
    ("checkpoint of another shape", ["train", "--config", "@TINY@", "resume=@CK@", "steps=4", "dim=64"], "dim"),
    # Settings that change the model's function without changing a tensor's shape, and the data stream.
    ("checkpoint of another layer pattern", ["train", "--config", "@TINY@", "resume=@CK@", "steps=4", "layer_pattern=LG",
                                             "window=64"], "layer_pattern"),
    ("checkpoint of another RoPE", ["train", "--config", "@TINY@", "resume=@CK@", "steps=4", "rope_theta=10000"],
     "rope_theta"),
    ("checkpoint of other documents", ["train", "--config", "@TINY@", "resume=@CK@", "steps=4", "docs=none"], "docs"),
    ("checkpoint of another norm", ["train", "--config", "@TINY@", "resume=@CK@", "steps=4", "norm_eps=1.0000001e-5"],
     "norm_eps"),
    ("checkpoint into another model for chat", ["chat", "--config", "@TINY@", "resume=@CK@", "rope_theta=10000", "docs=none",
                                                "schedule=prefill:64,decode:2"], "rope_theta"),
    ("token id beyond the vocabulary", ["train", "--config", "@TINY@", "data=@BADTOK@", "data_dtype=uint16",
                                        "docs=none"], "vocab"),
    ("eos_id beyond the vocabulary", ["train", "--config", "@TINY@", "data=@GOODTOK@", "data_dtype=uint16",
                                      "docs=none", "eos_id=256"], "eos_id"),
    ("predict placing a token file without document ends", ["predict", "data=@GOODTOK@", "seq=1K"],
     "eos_id = -1 marks none"),
    ("predict placing a token file in a mesh search", ["predict", "data=@GOODTOK@", "eos_id=7", "seq=1K", "predict_chips=8"],
     "placement is reported for predict_mesh"),
    ("predict placing a missing token file", ["predict", "data=/nonexistent/tokens.bin", "eos_id=7"], "neither 'synthetic'"),
    # Inference: schedules, lengths, meshes and algorithms (a small model, as tests/infer's).
    ("chat schedule without a first prefill", ["chat", *INFER_MODEL, "schedule=decode:2"], "must start with a prefill"),
    ("chat prefill lengths fewer than the batch", ["chat", *INFER_MODEL, "batch=3", "schedule=prefill:4/5,decode:2"],
     "a prefill with 2 lengths for batch = 3"),
    ("chat prefill length of zero", ["chat", *INFER_MODEL, "batch=2", "schedule=prefill:4/0,decode:2"],
     "needs lengths >= 1 separated by '/'"),
    ("prefill with both cached and miss_rate", ["prefill", *INFER_MODEL, "seq=512", "cached=256", "miss_rate=0.5"], "both set"),
    ("prefill with the whole sequence cached", ["prefill", *INFER_MODEL, "seq=512", "cached=512"],
     "needs 0 < cached < seq = 512"),
    ("bench infer with a dp axis", ["bench", "infer", *INFER_MODEL, "mesh=dp:2"], "bench infer forms its own dp replicas"),
    ("chat tp not dividing the heads", ["chat", *INFER_MODEL, "mesh=tp:2", "heads=6", "kv_heads=3"],
     "tensor parallel tp:2 must divide heads = 6, and divide or be a multiple of kv_heads = 3"),
    ("chat tp with the valid sizes named", ["chat", *INFER_MODEL, "mesh=tp:2", "heads=6", "kv_heads=3"],
     "valid: tp = 1, 3, 6"),
    ("schedule with ';' between items", ["chat", *INFER_MODEL, "schedule=prefill:64;decode:2"], "separated by ','"),
    ("watchdog shorter than a second", ["train", "watchdog_s=1e-9"], "at least 1"),
    ("a 300-digit value quoted short", ["train", "lr=" + "9" * 300], "(300 characters)"),
    ("chat cp_algo not an algorithm", ["chat", *INFER_MODEL, "cp_algo=ring"], "expected one of: auto, pass_kv, pass_q"),
    ("chat with an unknown hardware profile", ["chat", *INFER_MODEL, "hardware=h100-xyz"],
     "hardware = 'h100-xyz': hardware: no profile 'h100-xyz'"),
    ("chat with the old hw_profile key", ["chat", *INFER_MODEL, "hw_profile=h100-gtt"],
     "hw_profile (command line) was merged into 'hardware'"),
    ("deterministic chat with K/V heads replicated over tp", ["chat", *INFER_MODEL, "deterministic=true", "kv_heads=1",
                                                             "mesh=tp:2"], "deterministic = true with tp:2"),
]


def make_checkpoint(binary, root, work):
    """One real checkpoint of the tiny model at step 2 (shared by the cases that copy it)."""
    ck = os.path.join(work, "ck.h5")
    cmd = ["mpirun", "-np", str(NP), "--oversubscribe", "--bind-to", "none", binary, "train", "--config",
           os.path.join(root, "inputs", "tiny.toml"), "steps=2", "warmup=0", "checkpoint_every=2",
           "checkpoint=" + ck, "out=" + os.path.join(work, "ck_run.h5")]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    if p.returncode != 0 or not os.path.isfile(ck):
        raise SystemExit(f"could not write the fixture checkpoint:\n{p.stdout}\n{p.stderr}")
    return ck


def make_fixtures(tmp, root, ck):
    f = {"TMP": tmp, "TINY": os.path.join(root, "inputs", "tiny.toml")}
    def path(name):
        return os.path.join(tmp, name)
    with open(path("bad.toml"), "w") as fh:
        fh.write("seq = \n")
    with open(path("unknown.toml"), "w") as fh:
        fh.write("colour = \"red\"\n")
    with open(path("good.toml"), "w") as fh:
        fh.write("seq = 1024\n")
    with open(path("notes.txt"), "w") as fh:
        fh.write("a file of the user's\n")
    with open(path("mine.toml"), "w") as fh:
        fh.write("name = \"mine\"\n")
    with open(path("shard.toml"), "w") as fh:
        fh.write("shard = \"optimizer\"\n")
    f["SHARDTOML"] = path("shard.toml")
    f.update(BADTOML=path("bad.toml"), UNKNOWNTOML=path("unknown.toml"), GOODTOML=path("good.toml"),
             NOTES=path("notes.txt"), PROFILE=path("mine.toml"))
    rng = np.random.default_rng(1)
    for name, bad in (("attn.h5", False), ("attn_nan.h5", True)):
        with h5py.File(path(name), "w") as h:
            for d, heads in (("q", 2), ("k", 2), ("v", 2), ("do", 2)):
                x = rng.standard_normal((64, heads, 16)).astype(np.float32)
                if bad and d == "k":
                    x[37, 1, 5] = np.nan
                h[d] = x
    f.update(ATTN=path("attn.h5"), ATTNNAN=path("attn_nan.h5"))
    shutil.copy(path("attn.h5"), path("attn_arr.h5"))
    with h5py.File(path("attn_arr.h5"), "r+") as h:
        h.attrs["causal"] = np.ones(64, dtype=np.int64)  # an array where one number belongs
    with h5py.File(path("attn_big.h5"), "w") as h:  # 16M tokens declared, no data stored (sparse)
        for d in ("q", "k", "v", "do"):
            h.create_dataset(d, shape=(1 << 24, 8, 64), dtype=np.float32)
    f.update(ATTNARR=path("attn_arr.h5"), ATTNBIG=path("attn_big.h5"))
    with open(path("nest.toml"), "w") as fh:
        fh.write("seq = " + "[" * 100000 + "]" * 100000 + "\n")
    f["NESTTOML"] = path("nest.toml")
    with open(path("user.h5.lock"), "w") as fh:
        fh.write("the user's own notes\n")
    with open(os.path.join(root, "inputs", "hardware", "h100-gtt.toml")) as fh:
        hw = fh.read()
    import re
    hw = re.sub(r"(?m)^intra_latency_us\s*=.*$", "intra_latency_us = nan", hw)
    with open(path("hw_nan.toml"), "w") as fh:
        fh.write(hw)
    f["HWNAN"] = path("hw_nan.toml")
    with h5py.File(path("train_trace.h5"), "w") as h:  # what a finished `ctxpar train` leaves
        h.attrs.update({"ctxpar_file": "trace", "schema_version": 1, "mode": "train", "bench": "none",
                        "status": "complete"})
    f["TRAINTRACE"] = path("train_trace.h5")
    shutil.copy(ck, path("ck.h5"))
    shutil.copy(ck, path("ck_inf.h5"))
    with h5py.File(path("ck_inf.h5"), "r+") as h:
        x = h["adam_m/layers.1.w2"][...]
        x[3, 5] = np.inf
        h["adam_m/layers.1.w2"][...] = x
    shutil.copy(ck, path("ck_nonext.h5"))
    with h5py.File(path("ck_nonext.h5"), "r+") as h:
        del h.attrs["next_sample"]
    f.update(CK=path("ck.h5"), CKINF=path("ck_inf.h5"), CKNONEXT=path("ck_nonext.h5"))
    tok = (np.arange(8192) % 200).astype("<u2")
    tok[100] = 9999  # beyond the tiny model's vocabulary, in the first sample a run reads
    tok.tofile(path("tokens.bin"))
    f["BADTOK"] = path("tokens.bin")
    (np.arange(8192) % 200).astype("<u2").tofile(path("good_tokens.bin"))
    f["GOODTOK"] = path("good_tokens.bin")
    with open(path("binary.toml"), "wb") as fh:
        fh.write(bytes(range(256)) * 4)
    f["BINARY"] = path("binary.toml")
    os.mkdir(path("p.h5.partial"))
    return f


def snapshot(d):
    """Every file and directory under d with its size and modification time."""
    out = {}
    for base, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(base, n)
            st = os.lstat(p)
            out[os.path.relpath(p, d)] = (st.st_size, st.st_mtime_ns)
    return out


# Cases refused only after the checks, when the run locks its outputs: end to end only.
E2E = {"a user's file where the lock goes", "a later output that cannot be made leaves no directory"}
SAMPLE = 8  # every SAMPLE-th of the other cases runs end to end as well


def judge(rc, out, err, dt, must, before, after):
    """The problems of one case's run: its exit code, its streams, its files."""
    text = out + err
    msg_lines = [l for l in err.splitlines() if l.startswith("ctxpar: error:")]
    problems = []
    if rc != 2:
        problems.append(f"exit code {rc}, expected 2")
    if must not in text:
        problems.append(f"message does not name '{must}'")
    if len(msg_lines) != 1:
        problems.append(f"{len(msg_lines)} error lines on stderr, expected exactly 1 (rank 0 only)")
    if any(l.startswith("ctxpar: error:") for l in out.splitlines()):
        problems.append("an error line on stdout (errors belong on stderr)")
    for bad in ("Signal:", "terminate called", "Backtrace", "[ 0]"):
        if bad in text:
            problems.append(f"'{bad}' in the output: a backtrace")
    created = sorted(set(after) - set(before))
    changed = sorted(k for k in before if k in after and before[k] != after[k])
    removed = sorted(set(before) - set(after))
    if created:
        problems.append(f"created {created}")
    if changed:
        problems.append(f"changed {changed}")
    if removed:
        problems.append(f"removed {removed}")
    if dt > TIMEOUT_S:
        problems.append(f"took {dt:.1f} s")
    return problems, (msg_lines[0] if msg_lines else text.strip()[:200])


def run_e2e(binary, tmp, args):
    # "ENV:KEY=VALUE" items are the job's environment, not arguments (end to end only)
    env = dict(ENV, **dict(a[4:].split("=", 1) for a in args if a.startswith("ENV:")))
    cmd = ["mpirun", "-np", str(NP), "--oversubscribe", "--bind-to", "none", binary] + [a for a in args if not a.startswith("ENV:")]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired:
        return None, "", "(timed out)", time.time() - t0


def split_markers(stream, n):
    """Per case: the lines between '@@ctxpar-case i' and '@@ctxpar-rc i ...', and the rc line."""
    parts, rcs, cur, idx = [""] * n, {}, None, None
    for line in stream.splitlines(keepends=True):
        if line.startswith("@@ctxpar-case "):
            idx = int(line.split()[1])
            cur = []
            continue
        if line.startswith("@@ctxpar-rc "):
            f = line.split()
            rcs[int(f[1])] = (int(f[2]), float(f[3]))
            parts[int(f[1])] = "".join(cur or [])
            cur = None
            continue
        if cur is not None:
            cur.append(line)
    return parts, rcs


def run_batch(check_inputs, cases):
    """Every (tmp, args) case through check_inputs in one MPI job: [(rc, out, err, seconds)]."""
    with tempfile.NamedTemporaryFile("w", suffix=".cases", delete=False) as fh:
        for tmp, args in cases:
            fh.write("\x1f".join([tmp] + args) + "\n")
        path = fh.name
    cmd = ["mpirun", "-np", str(NP), "--oversubscribe", "--bind-to", "none", check_inputs, path]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=TIMEOUT_S * len(cases))
    os.remove(path)
    outs, rc_out = split_markers(p.stdout, len(cases))
    errs, _ = split_markers(p.stderr, len(cases))
    res = []
    for i in range(len(cases)):
        rc, dt = rc_out.get(i, (None, 0.0))
        if rc is None:
            errs[i] += f"(check_inputs did not finish this case: exit {p.returncode})\n{p.stderr[-2000:]}"
        res.append((2 if rc == 2 else rc, outs[i], errs[i], dt))
    return res


def main():
    binary, check_inputs, root = (os.path.abspath(a) for a in sys.argv[1:4])
    show = "--table" in sys.argv
    all_e2e = "--all-e2e" in sys.argv
    work = tempfile.mkdtemp(prefix="ctxpar-bad-fixtures-")
    ck = make_checkpoint(binary, root, work)
    prepared = []  # (name, tmp, args, must, e2e)
    for i, (name, args, must) in enumerate(CASES):
        tmp = tempfile.mkdtemp(prefix="ctxpar-bad-")
        fx = make_fixtures(tmp, root, ck)
        for k, v in fx.items():
            args = [a.replace("@" + k + "@", v) for a in args]
        if not any(a.startswith("out=") for a in args):
            args = args + ["out=" + os.path.join(tmp, "o", "run.h5")]
        prepared.append((name, tmp, args, must, all_e2e or name in E2E or i % SAMPLE == 0))
    # a case with a newline in an argument cannot go through the cases file (a line per case): end to end only
    in_process = {t for n, t, a, m, e in prepared
                  if n not in E2E and not any("\n" in x or x.startswith("ENV:") for x in a)}
    prepared = [(n, t, a, m, e or t not in in_process) for n, t, a, m, e in prepared]
    before = {t: snapshot(t) for _, t, _, _, _ in prepared}
    time.sleep(0.01)  # a change within the same mtime tick would still differ in size or mtime
    batch = [(t, a) for n, t, a, m, e in prepared if t in in_process]
    batch_res = dict(zip([t for t, _ in batch], run_batch(check_inputs, batch))) if batch else {}
    failures, rows = [], []
    for name, tmp, args, must, e2e in prepared:
        runs = []
        if tmp in batch_res:
            runs.append(("in process",) + batch_res[tmp])
        if e2e:
            runs.append(("end to end",) + run_e2e(binary, tmp, args))
        after = snapshot(tmp)
        for how, rc, out, err, dt in runs:
            problems, msg = judge(rc, out, err, dt, must, before[tmp], after)
            rows.append((name, how, " ".join(a.replace(tmp, "$TMP").replace(root, "$REPO") for a in args), rc,
                         f"{dt:.2f}", msg.replace(tmp, "$TMP")))
            if problems:
                failures.append((f"{name} ({how})", problems, out + err))
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    if show:
        print("| case | run | arguments | exit | s | message |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |")
    for name, problems, text in failures:
        print(f"FAIL {name}: {'; '.join(problems)}\n---\n{text}\n---")
    n_e2e = sum(1 for r in rows if r[1] == "end to end")
    print(f"{len(CASES)} cases ({len(rows) - n_e2e} in process, {n_e2e} end to end): "
          f"{len(rows) - len(failures)} runs passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
