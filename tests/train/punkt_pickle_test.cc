// NLTK 3.8's pickled Punkt parameters (tests/data/nltk_data/tokenizers/punkt/PY3/english.pickle,
// made by tools/reference/punkt_reference.py) read to the same parameters as the punkt_tab files
// beside them; malformed pickles give errors naming the file.
#include "train/punkt_pickle.h"

#include <gtest/gtest.h>

#include "ckpt/temp_dir.h"

namespace gale {
namespace {

using testing_util::TempDir;
using testing_util::write_bytes;

const std::string kData = std::string(GALE_TEST_DATA_DIR) + "/nltk_data/tokenizers";

TEST(PunktPickle, SameParametersAsThePunktTabFiles) {
  auto pickled = load_punkt_pickle(kData + "/punkt/PY3/english.pickle");
  ASSERT_TRUE(pickled.ok()) << pickled.status().message();
  auto tab = load_punkt_tab(kData + "/punkt_tab/english");
  ASSERT_TRUE(tab.ok()) << tab.status().message();
  EXPECT_EQ(pickled->abbrev_types, tab->abbrev_types);
  EXPECT_EQ(pickled->collocations, tab->collocations);
  EXPECT_EQ(pickled->sent_starters, tab->sent_starters);
  EXPECT_EQ(pickled->ortho_context, tab->ortho_context);
  EXPECT_GT(pickled->ortho_context.size(), 10000u);
  EXPECT_TRUE(pickled->collocations.count({"gone", "home"}));
}

TEST(PunktPickle, ErrorsNameTheFile) {
  TempDir dir;
  EXPECT_EQ(load_punkt_pickle(dir.file("missing.pickle")).status().code(), StatusCode::kNotFound);
  // A pickled int, and a dict without the parameters' sets.
  write_bytes(dir.file("int.pickle"), std::string("\x80\x02K\x07.", 5));
  auto st = load_punkt_pickle(dir.file("int.pickle")).status();
  EXPECT_NE(st.message().find(dir.file("int.pickle") + ": expected a pickled nltk.tokenize.punkt."
                              "PunktSentenceTokenizer with _params, found int"),
            std::string::npos)
      << st.message();
  write_bytes(dir.file("truncated.pickle"), std::string("\x80\x02}q\x00(X", 7));
  st = load_punkt_pickle(dir.file("truncated.pickle")).status();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir.file("truncated.pickle")), std::string::npos) << st.message();
}

}  // namespace
}  // namespace gale
