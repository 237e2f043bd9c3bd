// --window-size (Megatron's (left, right) sliding-window attention) and --window-attn-skip-freq (its full-attention layers), mapped onto --sliding-window and a per-layer pattern.
#include "train/arguments.h"

#include <algorithm>
#include <cctype>

namespace gale {

void add_window_args(ArgParser& p, ModelArgs& a) {
  p.add("--window-size", &a.window_size,
        "Megatron's sliding-window attention (left,right), e.g. 4095,0: a query at position i attends the keys at "
        "positions i-left .. i (-1: unbounded; the causal mask makes right 0, as Transformer Engine does); the same "
        "as --sliding-window left+1; unset: full causal attention");
  p.add("--window-attn-skip-freq", &a.window_attn_skip_freq,
        "the full-attention layers among --window-size's windowed ones: an int N (every N-th layer full) or a list of "
        "one 0/1 per layer such as \"([1]*3+[0]*1)*2\" (1: windowed, 0: full); unset: every layer windowed");
}

StatusOr<WindowSize> parse_window_size(const std::string& value) {
  std::string v;
  for (char ch : value)
    if (!std::isspace(static_cast<unsigned char>(ch))) v += ch;
  if (!v.empty() && v.front() == '(') v.erase(v.begin());
  if (!v.empty() && v.back() == ')') v.pop_back();
  const auto bad = [&] {
    return InvalidArgument("--window-size: expected two integers left,right such as 4095,0 or (4095,0), found '",
                           value, "'");
  };
  const size_t comma = v.find(',');
  if (comma == std::string::npos || v.find(',', comma + 1) != std::string::npos) return bad();
  WindowSize w;
  for (auto [text, out] : {std::pair{v.substr(0, comma), &w.left}, {v.substr(comma + 1), &w.right}}) {
    const bool digits = !text.empty() && std::all_of(text.begin() + (text[0] == '-' ? 1 : 0), text.end(), [](char ch) {
      return std::isdigit(static_cast<unsigned char>(ch));
    });
    if (!digits || text == "-" || text.size() > 12) return bad();
    *out = std::stoll(text);
  }
  return w;
}

Status validate_window_args(ModelArgs& m) {
  m.window_attn_pattern.clear();
  if (!m.window_size.empty()) {
    GALE_ASSIGN_OR_RETURN(const WindowSize w, parse_window_size(m.window_size));
    // Transformer Engine's check for causal masks (check_set_window_size): (left >= 0, any right) runs
    // as (left, 0); (-1, -1) and (-1, 0) are full causal attention; any other is refused.
    if (w.left < -1 || (w.left == -1 && w.right != -1 && w.right != 0))
      return InvalidArgument("--window-size ", m.window_size,
                             ": expected left >= 0, or -1 (unbounded) with right -1 or 0, found left ", w.left,
                             " and right ", w.right);
    const int64_t window = w.left < 0 ? kUnset : w.left + 1;
    if (m.sliding_window != kUnset && m.sliding_window != window)
      return InvalidArgument("--window-size ", m.window_size, " means --sliding-window ",
                             window == kUnset ? std::string("unset (no window)") : std::to_string(window),
                             ", but --sliding-window ", m.sliding_window, " is given");
    m.sliding_window = window;
  }
  if (m.window_attn_skip_freq.empty()) return Status::Ok();
  // Megatron's is_layer_window_attention: layer number n (1-based) is windowed iff n % N != 0, or
  // list[n − 1] is nonzero; without a window it changes nothing.
  GALE_ASSIGN_OR_RETURN(std::vector<int> pattern,
                        parse_layer_pattern("--window-attn-skip-freq", m.window_attn_skip_freq, m.num_layers,
                                            [](int64_t k, int64_t i) { return (i + 1) % k != 0; }));
  if (m.sliding_window == kUnset) return Status::Ok();
  if (m.is_hybrid_model) return Unimplemented("--window-attn-skip-freq with --is-hybrid-model: not supported yet");
  if (m.mtp_num_layers != kUnset && m.mtp_num_layers > 0)
    return Unimplemented("--window-attn-skip-freq with --mtp-num-layers ", m.mtp_num_layers,
                         ": not supported yet (the MTP layers' place in the pattern)");
  m.window_attn_pattern = std::move(pattern);
  return Status::Ok();
}

}  // namespace gale
