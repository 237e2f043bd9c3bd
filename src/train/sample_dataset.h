// What the trainer reads: samples of S tokens with labels, loss mask, positions and documents.
//
// TrainingSample and SampleDataset are defined in data/sample.h, next to the datasets that
// implement them (the data layer cannot include train/); this header keeps the trainer's include.
#pragma once

#include "data/sample.h"
