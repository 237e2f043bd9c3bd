// The X and Y axes of MindSpeed's 2-D tensor parallelism (--tp-2d --tp-x X --tp-y Y), as groups.
//
// The TP group of X·Y ranks is an X×Y grid. As in MindSpeed (parallel_state_2d: the "nd1_dim1"
// groups are consecutive TP ranks), TP rank r sits at x = r mod X, y = r / X: the X-axis group of
// r is the X consecutive TP ranks {yX, ..., yX + X − 1} (same y), the Y-axis group the Y ranks
// {x, x + X, ..., x + (Y − 1)X} (same x). E.g. X = 2, Y = 2: X groups {0, 1}, {2, 3}; Y groups
// {0, 2}, {1, 3} (TP ranks, mapped to world ranks through the TP group).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/rank_grid.h"

namespace gale {

struct Tp2dGroups {
  Comm x;  // the X ranks of this rank's row of the grid (its y fixed)
  Comm y;  // the Y ranks of its column (its x fixed)
};

// The TP ranks of the X-axis and Y-axis groups of TP rank `tp_rank` (pure; tp_size = X·Y).
std::vector<int64_t> tp2d_x_members(int64_t tp_size, int64_t tp_x, int64_t tp_rank);
std::vector<int64_t> tp2d_y_members(int64_t tp_size, int64_t tp_x, int64_t tp_rank);

// The lines `gale pretrain` and `gale layout` print after the rank layout: the grid's rule and the
// "tp-x" and "tp-y" groups of every TP group in global ranks, as render_rank_layout lists groups:
//   tp-2d: TP 4 = X 2 x Y 2, tp rank = x + 2*y
//     tp-x                [0,1] [2,3] [4,5] [6,7]
//     tp-y                [0,2] [1,3] [4,6] [5,7]
std::string render_tp2d_groups(const RankLayout& layout, int64_t tp_x);

// Creates both groups from the TP group `tp` (X must divide its size). Collective over `tp`:
// every member calls it with the same X.
Tp2dGroups make_tp2d_groups(const Comm& tp, int64_t tp_x);

}  // namespace gale
