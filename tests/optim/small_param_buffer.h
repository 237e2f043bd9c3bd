// Test helper: a finalized ParamBuffer of six parameters of 35, 5, 13, 33, 17 and 2 elements (105
// in all), odd sizes that split unevenly across data-parallel ranks and buckets.
#pragma once

#include <string>
#include <vector>

#include "model/params.h"

namespace gale::testing {

inline ParamBuffer small_param_buffer() {
  ParamBuffer pb;
  const std::vector<Shape> shapes = {{7, 5}, {5}, {13}, {3, 11}, {17}, {2}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    ParamSpec s;
    s.name = "p" + std::to_string(i);
    s.global_shape = shapes[i];
    pb.add(s);
  }
  pb.finalize();
  return pb;
}

}  // namespace gale::testing
