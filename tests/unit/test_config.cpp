// Config: the field table parses defaults, TOML and overrides the same way and rejects bad input
// with a message that names the field and what would be valid.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/config.hpp"
#include "core/error.hpp"
#include "cp/strategy.hpp"

using namespace ctxpar;

namespace {
// The program states the registry's strategy names before it parses (app/startup.cpp); so do these tests.
[[maybe_unused]] const bool kChoicesStated = (state_strategy_choices(), true);

std::string error_of(const std::string& toml, const std::vector<std::string>& args, int world = 4) {
  try {
    Config c = parse_config(toml, "test.toml", args);
    validate_config(c, world);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, DefaultsComeFromTheTable) {
  Config c = parse_config("", "", {});
  for (const Field& f : config_fields()) EXPECT_EQ(field_text(c, f), field_text(parse_config("", "", {}), f));
  EXPECT_EQ(c.seq, 4096);
  EXPECT_EQ(c.strategy, "ring");
  EXPECT_FALSE(c.csv);
}

// The strategy fields take the names the program states (the registry's); before it states any,
// parsing refuses every name rather than letting one through unchecked.
// The mode column names only real modes, and a key a mode does not read is refused on the command
// line, in either form, naming the modes that read it; keys every mode reads pass.
TEST(Config, KeysAModeDoesNotReadAreRefused) {
  const std::vector<std::string>& all = mode_names_for_keys();
  for (const Field& f : config_fields()) {
    std::vector<std::string> modes;
    if (f.modes.empty()) continue;
    ASSERT_EQ(split_list(f.modes, ',', modes), "") << f.name;
    for (const std::string& m : modes)
      EXPECT_NE(std::find(all.begin(), all.end(), m), all.end()) << f.name << ": '" << m << "' is not a mode";
  }
  const std::string e = check_keys_for_mode({"seq=1K", "cp_algo=pass_q"}, "train");
  EXPECT_NE(e.find("cp_algo (command line) is not read by `ctxpar train`"), std::string::npos) << e;
  EXPECT_NE(e.find("prefill, decode, chat, bench infer"), std::string::npos) << e;
  EXPECT_NE(check_keys_for_mode({"--lr=1e-3"}, "chat").find("lr (command line)"), std::string::npos);
  EXPECT_EQ(check_keys_for_mode({"threads=1", "out=x.h5", "mesh=ring:2"}, "bench peak"), "");
  EXPECT_EQ(check_keys_for_mode({"cp_algo=pass_q", "save_logits=true"}, "chat"), "");
}

// A config file's keys are not refused (a file serves several modes) but those the mode does not
// read are listed, for main's note.
TEST(Config, FileKeysAModeDoesNotReadAreListed) {
  std::vector<std::string> keys;
  parse_config("seq = 1024\nlr = 1e-3\ncp_algo = \"pass_q\"\n", "t.toml", {"steps=2"}, &keys);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"cp_algo", "lr", "seq"}));  // the file's, not the command line's
  EXPECT_EQ(keys_not_read(keys, "chat"), std::vector<std::string>{"lr"});
  EXPECT_EQ(keys_not_read(keys, "train"), std::vector<std::string>{"cp_algo"});
  EXPECT_EQ(keys_not_read({"seq", "unknown_key"}, "bench peak"), std::vector<std::string>{"seq"});
}

TEST(Config, StrategyNamesComeFromTheProgram) {
  const StrategyChoices held = strategy_choices();
  EXPECT_EQ(error_of("", {"strategy=usp", "local_strategy=halo"}), "");
  set_strategy_choices({{"ring", "spiral"}, {"halo", "spiral"}, "spiral", "halo"});  // and their defaults
  EXPECT_EQ(error_of("", {"strategy=spiral", "local_strategy=spiral"}), "");
  EXPECT_EQ(parse_config("", "", {}).strategy, "spiral");
  EXPECT_EQ(parse_config("", "", {}).local_strategy, "halo");
  EXPECT_NE(error_of("", {"strategy=usp"}).find("one of: ring, spiral, auto, all"), std::string::npos);
  EXPECT_NE(help_text("train").find("{ring|spiral|auto|all}"), std::string::npos);
  set_strategy_choices({});
  EXPECT_NE(error_of("", {}).find("stated none"), std::string::npos);
  set_strategy_choices(held);
}

TEST(Config, SizesAcceptBinarySuffixes) {
  int64_t v = 0;
  EXPECT_TRUE(parse_size("128K", v));
  EXPECT_EQ(v, 131072);
  EXPECT_TRUE(parse_size("1M", v));
  EXPECT_EQ(v, 1 << 20);
  EXPECT_TRUE(parse_size("7", v));
  EXPECT_EQ(v, 7);
  EXPECT_FALSE(parse_size("12Q", v));
  EXPECT_FALSE(parse_size("", v));
  EXPECT_FALSE(parse_size("K", v));
}

// An integer key in TOML takes a TOML integer, as the command line takes digits only.
TEST(Config, TomlFloatForAnIntegerKeyIsRefused) {
  for (const char* toml : {"seq = 1e3\n", "seq = 4096.0\n"})
    EXPECT_NE(error_of(toml, {}).find("seq in test.toml is a floating-point number"), std::string::npos) << toml;
  EXPECT_NE(error_of("", {"seq=1e3"}), "");
  EXPECT_EQ(error_of("seq = 4096\n", {}), "");
  EXPECT_EQ(error_of("miss_rate = 0.5\n", {}), "");  // a float key takes a float
}

TEST(Config, OverridesInBothFormsAndAfterToml) {
  Config c = parse_config("seq = 2048\nstrategy = \"allgather\"\nwatchdog_s = 5.5\ncsv = true\n", "x.toml",
                          {"seq=8K", "--heads=16"});
  EXPECT_EQ(c.seq, 8192);      // command line wins over the file
  EXPECT_EQ(c.heads, 16);
  EXPECT_EQ(c.strategy, "allgather");
  EXPECT_DOUBLE_EQ(c.watchdog_s, 5.5);
  EXPECT_TRUE(c.csv);
}

TEST(Config, UnknownKeySuggestsTheNearestField) {
  const std::string e = error_of("", {"sequ=4K"});
  EXPECT_NE(e.find("unknown key 'sequ'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'seq'"), std::string::npos) << e;
  EXPECT_NE(error_of("bogus = 1\n", {}).find("unknown key 'bogus' in test.toml"), std::string::npos);
}

TEST(Config, BadValuesNameFieldAndValidValues) {
  std::string e = error_of("", {"seq=abc"});
  EXPECT_NE(e.find("seq = 'abc'"), std::string::npos) << e;
  EXPECT_NE(e.find("integer"), std::string::npos) << e;
  e = error_of("", {"strategy=spiral"});
  EXPECT_NE(e.find("one of: allgather, ulysses, ring, usp"), std::string::npos) << e;
  e = error_of("", {"head_dim=512"});
  EXPECT_NE(e.find("[1, 256]"), std::string::npos) << e;
  e = error_of("", {"csv=maybe"});
  EXPECT_NE(e.find("true or false"), std::string::npos) << e;
  e = error_of("", {"watchdog_s=-1"});
  EXPECT_NE(e.find("watchdog_s"), std::string::npos) << e;
  e = error_of("seq = [1, 2]\n", {});
  EXPECT_NE(e.find("seq in test.toml must be"), std::string::npos) << e;
  e = error_of("seq = \n", {});
  EXPECT_NE(e.find("cannot parse test.toml"), std::string::npos) << e;
  e = error_of("", {"novalue"});
  EXPECT_NE(e.find("key=value"), std::string::npos) << e;
}

TEST(Config, MeshParsingAndProduct) {
  MeshSpec m = parse_mesh("ring:4,ulysses:2", 8);
  EXPECT_EQ(m.ring, 4);
  EXPECT_EQ(m.ulysses, 2);
  EXPECT_EQ(m.dp, 1);
  EXPECT_EQ(m.tp, 1);
  EXPECT_EQ(parse_mesh("", 6).ring, 6);
  EXPECT_NE(error_of("", {"mesh=ring:3"}, 4).find("= 3 ranks, but the job has 4"), std::string::npos);
  EXPECT_NE(error_of("", {"mesh=torus:4"}).find("unknown axis 'torus'"), std::string::npos);
  EXPECT_NE(error_of("", {"mesh=ring:0"}).find("needs a size"), std::string::npos);
  EXPECT_NE(error_of("", {"mesh=ring:2,ring:2"}).find("given twice"), std::string::npos);
  EXPECT_EQ(error_of("", {"mesh=tp:2,ring:2"}, 4), "");
}

TEST(Config, CrossFieldChecks) {
  EXPECT_NE(error_of("", {"heads=6", "kv_heads=4"}).find("not a multiple of kv_heads"), std::string::npos);
  EXPECT_NE(error_of("", {"mask=window"}).find("window ≥ 1"), std::string::npos);
  EXPECT_NE(error_of("", {"window=5"}).find("mask = causal"), std::string::npos);
  EXPECT_EQ(error_of("", {"mask=window", "window=128"}), "");
}

TEST(Config, HelpAndListingCoverEveryField) {
  const std::string keys = help_keys_markdown(), list = config_listing(parse_config("", "", {}));
  EXPECT_EQ(help_groups_error(), "");
  for (const Field& f : config_fields()) {
    EXPECT_NE(keys.find("| `" + std::string(f.name) + "` |"), std::string::npos) << f.name;
    EXPECT_NE(list.find(std::string(f.name)), std::string::npos) << f.name;
  }
}

// Columns of a line as a terminal shows them (UTF-8: one per code point).
size_t columns(const std::string& line) {
  size_t n = 0;
  for (unsigned char c : line) n += (c & 0xC0) != 0x80;
  return n;
}

// `ctxpar MODE --help`: exactly the keys the mode reads (by the mode column), each once, every
// line within the width; `ctxpar --help` too.
TEST(Config, EachModesHelpListsItsOwnKeysWithinTheWidth) {
  for (const std::string& mode : mode_names_for_keys()) {
    const std::string text = help_text(mode, 80);
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) EXPECT_LE(columns(line), 80u) << mode << ": " << line;
    for (const Field& f : config_fields()) {
      const std::string key = "\n  " + std::string(f.name) + "=";
      const size_t at = text.find(key);
      const bool listed = at != std::string::npos, once = listed && text.find(key, at + 1) == std::string::npos;
      const bool read = keys_not_read({std::string(f.name)}, mode).empty();
      EXPECT_EQ(listed, read) << mode << ": " << f.name;
      if (listed) {
        EXPECT_TRUE(once) << mode << ": " << f.name;
      }
    }
  }
  std::istringstream lines(help_text("", 80));
  for (std::string line; std::getline(lines, line);) EXPECT_LE(columns(line), 80u) << line;
}

// docs/keys.md is `ctxpar --help-keys`: regenerate it when a field changes.
TEST(Config, KeysDocIsTheFieldTable) {
  std::ifstream in(std::string(CTXPAR_SOURCE_DIR) + "/docs/keys.md");
  ASSERT_TRUE(in) << "docs/keys.md is missing";
  std::ostringstream doc;
  doc << in.rdbuf();
  EXPECT_TRUE(doc.str() == help_keys_markdown())
      << "docs/keys.md differs from the field table: build/ctxpar --help-keys > docs/keys.md";
}

// One list splitter for every list-valued setting: empty items (a doubled, leading or trailing
// separator, an empty list) are refused with the item's position, never silently dropped.
TEST(Config, ListsRefuseEmptyItems) {
  std::vector<std::string> items;
  EXPECT_EQ(split_list("prefill:1K, decode:4", ',', items), "");
  EXPECT_EQ(items, (std::vector<std::string>{"prefill:1K", "decode:4"}));
  EXPECT_NE(split_list("a,b,", ',', items).find("trailing"), std::string::npos);
  EXPECT_NE(split_list(",a", ',', items).find("leading"), std::string::npos);
  EXPECT_NE(split_list("a,,b", ',', items).find("item 2"), std::string::npos);
  EXPECT_NE(split_list("  ", ',', items).find("empty"), std::string::npos);
  EXPECT_NE(error_of("", {"mesh=ring:2,ring:2,"}).find("trailing"), std::string::npos);
  EXPECT_NE(error_of("", {"docs=1K,,3K", "seq=4K"}).find("docs"), std::string::npos);
}

TEST(Config, BenchByteRangeMustBeOrdered) {
  const std::string e = error_of("", {"bench_min_bytes=1M", "bench_max_bytes=4K"});
  EXPECT_NE(e.find("bench_min_bytes"), std::string::npos) << e;
  EXPECT_EQ(error_of("", {"bench_min_bytes=4K", "bench_max_bytes=4K"}), "");
}
