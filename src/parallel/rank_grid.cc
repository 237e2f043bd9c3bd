// Rank generators, the group lists of every kind, and the start-up layout table.
#include "parallel/rank_grid.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>

#include "core/check.h"

namespace gale {

namespace {

const char* const kDims[] = {"tp", "cp", "ep", "dp", "pp"};

std::vector<std::string> split_dashes(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == '-') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  out.push_back(cur);
  return out;
}

std::string join_group(const std::vector<int>& g) {
  std::string s = "[";
  for (size_t i = 0; i < g.size(); ++i) s += (i ? "," : "") + std::to_string(g[i]);
  return s + "]";
}

}  // namespace

StatusOr<RankGenerator> RankGenerator::create(int tp, int ep, int dp, int pp, int cp, const std::string& order) {
  const int size_of_dim[] = {tp, cp, ep, dp, pp};
  for (int i = 0; i < 5; ++i)
    if (size_of_dim[i] <= 0)
      return InvalidArgument("rank layout: ", kDims[i], " size must be positive, found ", size_of_dim[i]);
  if (ep > 1 && cp > 1)
    return InvalidArgument("rank layout: expert parallelism (", ep, ") and context parallelism (", cp,
                           ") cannot both be > 1 in one rank generator");
  RankGenerator g;
  for (const std::string& tok : split_dashes(order)) {
    auto known = std::find_if(std::begin(kDims), std::end(kDims), [&](const char* d) { return tok == d; });
    if (known == std::end(kDims))
      return InvalidArgument("rank order '", order, "': unknown dimension '", tok, "' (expected tp, cp, ep, dp, pp)");
    if (std::find(g.dims_.begin(), g.dims_.end(), tok) != g.dims_.end())
      return InvalidArgument("rank order '", order, "': dimension '", tok, "' appears twice");
    g.dims_.push_back(tok);
  }
  for (int i = 0; i < 5; ++i) {
    if (std::find(g.dims_.begin(), g.dims_.end(), kDims[i]) != g.dims_.end()) continue;
    if (size_of_dim[i] != 1)
      return InvalidArgument("rank order '", order, "' leaves out ", kDims[i], ", whose size is ", size_of_dim[i]);
    g.dims_.push_back(kDims[i]);
  }
  int stride = 1;
  for (const std::string& d : g.dims_) {
    int i = static_cast<int>(std::find(std::begin(kDims), std::end(kDims), d) - std::begin(kDims));
    g.sizes_.push_back(size_of_dim[i]);
    g.strides_.push_back(stride);
    stride *= size_of_dim[i];
  }
  g.world_size_ = stride;
  for (size_t i = 0; i < g.dims_.size(); ++i) g.order_ += (i ? "-" : "") + g.dims_[i];
  return g;
}

int RankGenerator::index_of(const std::string& dim) const {
  auto it = std::find(dims_.begin(), dims_.end(), dim);
  GALE_CHECK(it != dims_.end()) << "unknown rank dimension '" << dim << "' (order " << order_ << ")";
  return static_cast<int>(it - dims_.begin());
}

int RankGenerator::size_of(const std::string& dim) const { return sizes_[index_of(dim)]; }

int RankGenerator::coordinate(int rank, const std::string& dim) const {
  int i = index_of(dim);
  return (rank / strides_[i]) % sizes_[i];
}

RankGroups RankGenerator::get_ranks(const std::string& token) const {
  std::vector<bool> in_group(dims_.size(), false);
  for (const std::string& t : split_dashes(token)) in_group[index_of(t)] = true;
  std::vector<int> inner_sizes, inner_strides, outer_sizes, outer_strides;
  for (size_t i = 0; i < dims_.size(); ++i) {
    (in_group[i] ? inner_sizes : outer_sizes).push_back(sizes_[i]);
    (in_group[i] ? inner_strides : outer_strides).push_back(strides_[i]);
  }
  // Mixed-radix decomposition (first digit fastest) of `index` over `sizes`, dotted with `strides`.
  auto place = [](int index, const std::vector<int>& sizes, const std::vector<int>& strides) {
    int rank = 0;
    for (size_t j = 0; j < sizes.size(); ++j) {
      rank += (index % sizes[j]) * strides[j];
      index /= sizes[j];
    }
    return rank;
  };
  int group_size = 1;
  for (int s : inner_sizes) group_size *= s;
  RankGroups groups(static_cast<size_t>(world_size_ / group_size));
  for (size_t g = 0; g < groups.size(); ++g) {
    int base = place(static_cast<int>(g), outer_sizes, outer_strides);
    for (int k = 0; k < group_size; ++k) groups[g].push_back(base + place(k, inner_sizes, inner_strides));
  }
  return groups;
}

std::string RankGenerator::formula() const {
  std::string f;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (sizes_[i] == 1) continue;
    if (!f.empty()) f += " + ";
    f += strides_[i] == 1 ? dims_[i] : std::to_string(strides_[i]) + "*" + dims_[i];
  }
  return f.empty() ? "0" : f;
}

const char* group_name(Group g) {
  switch (g) {
    case Group::kTensor:
      return "tp";
    case Group::kPipeline:
      return "pp";
    case Group::kData:
      return "dp";
    case Group::kContext:
      return "cp";
    case Group::kDataContext:
      return "dp-cp";
    case Group::kModel:
      return "tp-pp";
    case Group::kTensorDataContext:
      return "tp-dp-cp";
    case Group::kTensorData:
      return "tp-dp";
    case Group::kTensorContext:
      return "tp-cp";
    case Group::kEmbedding:
      return "embedding";
    case Group::kPositionEmbedding:
      return "position-embedding";
    case Group::kExpert:
      return "expert-ep";
    case Group::kExpertTensor:
      return "expert-tp";
    case Group::kExpertTensorExpert:
      return "expert-tp-ep";
    case Group::kExpertTensorExpertPipeline:
      return "expert-tp-ep-pp";
    case Group::kExpertData:
      return "expert-dp";
    case Group::kCount:
      break;
  }
  return "?";
}

std::vector<int> RankLayout::group_of(Group g, int rank) const {
  for (const std::vector<int>& members : of(g))
    if (std::find(members.begin(), members.end(), rank) != members.end()) return members;
  return {};
}

RankCoords RankLayout::coords(int rank) const {
  GALE_CHECK(rank >= 0 && rank < static_cast<int>(coords_.size()))
      << "rank " << rank << " of a world of " << coords_.size();
  return coords_[rank];
}

StatusOr<RankLayout> compute_rank_layout(const ParallelSizes& sizes) {
  RankLayout layout;
  layout.sizes = sizes;
  ParallelSizes& s = layout.sizes;
  if (s.etp == 0) s.etp = s.tp;
  struct Flag {
    int value;
    const char* name;
  };
  for (Flag f : {Flag{s.world_size, "world size"}, Flag{s.tp, "--tensor-model-parallel-size"},
                 Flag{s.pp, "--pipeline-model-parallel-size"}, Flag{s.cp, "--context-parallel-size"},
                 Flag{s.ep, "--expert-model-parallel-size"}, Flag{s.etp, "--expert-tensor-parallel-size"}}) {
    if (f.value <= 0) return InvalidArgument(f.name, ": expected a positive integer, found ", f.value);
  }
  int model = s.tp * s.pp * s.cp;
  if (s.world_size % model != 0)
    return InvalidArgument("world size ", s.world_size, " is not divisible by --tensor-model-parallel-size ", s.tp,
                           " x --pipeline-model-parallel-size ", s.pp, " x --context-parallel-size ", s.cp, " = ",
                           model);
  int expert_model = s.etp * s.ep * s.pp;
  if (s.world_size % expert_model != 0)
    return InvalidArgument("world size ", s.world_size, " is not divisible by --expert-tensor-parallel-size ", s.etp,
                           " x --expert-model-parallel-size ", s.ep, " x --pipeline-model-parallel-size ", s.pp, " = ",
                           expert_model);
  layout.dp = s.world_size / model;
  layout.expert_dp = s.world_size / expert_model;
  const std::string order = s.use_tp_pp_dp_mapping ? "tp-cp-ep-pp-dp" : "tp-cp-ep-dp-pp";
  GALE_ASSIGN_OR_RETURN(RankGenerator dense, RankGenerator::create(s.tp, 1, layout.dp, s.pp, s.cp, order));
  GALE_ASSIGN_OR_RETURN(RankGenerator expert, RankGenerator::create(s.etp, s.ep, layout.expert_dp, s.pp, 1, order));
  if (!(order.ends_with("pp") || s.pp == 1 || layout.expert_dp == layout.dp))
    return InvalidArgument("--use-tp-pp-dp-mapping with --pipeline-model-parallel-size ", s.pp,
                           " needs the same data-parallel size for dense and expert layers (", layout.dp, " vs ",
                           layout.expert_dp, ")");
  RankGroups pp_groups = dense.get_ranks("pp");
  if (pp_groups != expert.get_ranks("pp"))
    return InvalidArgument("the expert layout (--expert-tensor-parallel-size ", s.etp,
                           " x --expert-model-parallel-size ", s.ep,
                           ") gives other pipeline groups than the dense layout (--tensor-model-parallel-size ", s.tp,
                           " x --context-parallel-size ", s.cp, ")");
  layout.order = dense.order();
  layout.formula = dense.formula();
  auto set = [&](Group g, RankGroups groups) { layout.groups[static_cast<int>(g)] = std::move(groups); };
  set(Group::kTensor, dense.get_ranks("tp"));
  set(Group::kPipeline, pp_groups);
  set(Group::kData, dense.get_ranks("dp"));
  set(Group::kContext, dense.get_ranks("cp"));
  set(Group::kDataContext, dense.get_ranks("dp-cp"));
  set(Group::kModel, dense.get_ranks("tp-pp"));
  set(Group::kTensorDataContext, dense.get_ranks("tp-dp-cp"));
  set(Group::kTensorData, dense.get_ranks("tp-dp"));
  set(Group::kTensorContext, dense.get_ranks("tp-cp"));
  RankGroups embedding, position;
  for (const std::vector<int>& p : pp_groups) {
    embedding.push_back(p.size() > 1 ? std::vector<int>{p.front(), p.back()} : std::vector<int>{p.front()});
    position.push_back({p.front()});
  }
  set(Group::kEmbedding, embedding);
  set(Group::kPositionEmbedding, position);
  set(Group::kExpert, expert.get_ranks("ep"));
  set(Group::kExpertTensor, expert.get_ranks("tp"));
  set(Group::kExpertTensorExpert, expert.get_ranks("tp-ep"));
  set(Group::kExpertTensorExpertPipeline, expert.get_ranks("tp-ep-pp"));
  set(Group::kExpertData, expert.get_ranks("dp"));
  for (int r = 0; r < s.world_size; ++r) {
    RankCoords c;
    c.tp = dense.coordinate(r, "tp");
    c.cp = dense.coordinate(r, "cp");
    c.dp = dense.coordinate(r, "dp");
    c.pp = dense.coordinate(r, "pp");
    c.ep = expert.coordinate(r, "ep");
    c.etp = expert.coordinate(r, "tp");
    c.edp = expert.coordinate(r, "dp");
    layout.coords_.push_back(c);
  }
  return layout;
}

std::string render_rank_layout(const RankLayout& layout, int max_rank_lines) {
  const ParallelSizes& s = layout.sizes;
  const bool moe = s.ep > 1 || s.etp != s.tp;
  std::ostringstream os;
  os << "parallel layout: world " << s.world_size << " = TP " << s.tp << " x CP " << s.cp << " x DP " << layout.dp
     << " x PP " << s.pp;
  if (moe)
    os << " (experts: ETP " << s.etp << " x EP " << s.ep << " x EDP " << layout.expert_dp << " x PP " << s.pp << ")";
  os << ", order " << layout.order << ": rank = " << layout.formula << "\n";
  os << "  rank    tp   cp   dp   pp" << (moe ? "   ep  etp  edp" : "") << "\n";
  int shown = std::min(s.world_size, std::max(max_rank_lines, 0));
  char line[96];
  for (int r = 0; r < shown; ++r) {
    RankCoords c = layout.coords(r);
    std::snprintf(line, sizeof line, "  %4d  %4d %4d %4d %4d", r, c.tp, c.cp, c.dp, c.pp);
    os << line;
    if (moe) {
      std::snprintf(line, sizeof line, " %4d %4d %4d", c.ep, c.etp, c.edp);
      os << line;
    }
    os << "\n";
  }
  if (shown < s.world_size) os << "  ... (" << s.world_size - shown << " more ranks)\n";
  constexpr size_t kMaxGroupsPerLine = 8;
  for (int g = 0; g < kNumGroups; ++g) {
    Group kind = static_cast<Group>(g);
    bool expert_kind = g >= static_cast<int>(Group::kExpert);
    if (expert_kind && !moe) continue;
    if (kind == Group::kContext || kind == Group::kDataContext || kind == Group::kTensorDataContext ||
        kind == Group::kTensorContext) {
      if (s.cp == 1) continue;  // the same as cp-less groups (dp, tp-dp, tp) when CP = 1
    }
    const RankGroups& groups = layout.of(kind);
    std::snprintf(line, sizeof line, "  %-19s", group_name(kind));
    os << line;
    for (size_t i = 0; i < groups.size() && i < kMaxGroupsPerLine; ++i) os << " " << join_group(groups[i]);
    if (groups.size() > kMaxGroupsPerLine) os << " ... (" << groups.size() << " groups)";
    os << "\n";
  }
  return os.str();
}

}  // namespace gale
