// The schedule validator: simulates every rank's action list of one step before anything runs,
// under a cost model, and either proves the lists complete or refuses them with the rank and
// action where they stall.
//
// Simulation rules (the executor's semantics): a send is posted and the rank goes on; a receive
// blocks the rank until the matching send has been posted and `transfer` has passed. Compute
// actions take their cost; a chunk's cost is the cost of one rank's share of the model divided by
// the chunks that share holds (interleaved chunks cost 1/v, See Schedule). Checked on the way:
// each receive names the rank that holds the neighbouring stage and is matched by exactly one
// send of that message; F of a non-first stage comes after its RA, B after its F (and its RG
// below the last stage), sends after the compute that produces them, W after its B, SYNC after
// every B and W of its chunk. A violation or a stall throws loom::Error naming the rank, the
// action's index and the action.
//
// Reported per rank: bubble = 1 - busy / makespan (busy: the time spent in F, B and W; makespan:
// when the last rank finishes), and peak_activations = the most micro-batches whose forward on
// one of the rank's chunks has run and whose backward (and W, when split) has not, counted per
// chunk. With unit costs GPipe and 1F1B give bubble (p-1)/(m+p-1); GPipe keeps m activations,
// 1F1B at most p on the first stage.
//
// Note [Expert parallelism and the schedule]
// A MoE layer's all-to-alls run inside the F and B of its chunk, over its ep group. That group is
// carved from the dp ranks of one pp rank (loom-gpt's expert_groups: ep consecutive dp ranks),
// and every dp replica of a pp rank runs that rank's one action list, so the members of an ep
// group reach their all-to-alls (and the routing pass's, and the experts' reductions over their
// replicas, and Chimera's replica-pair sums) in the same order by construction: there is no
// interleaving across ranks for a schedule to get wrong, and nothing of it for this validator,
// which checks one action list per pp rank, to refuse. What could break it (an ep group spanning
// pp ranks, dp replicas of a pp rank running different lists) is not a layout loom builds. The
// all-to-alls' cost is part of the F and B costs the validator is given.
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace loom::parallel::pipeline {

struct CostModel {  // unit costs by default
  double forward = 1.0;
  double backward = 1.0;     // B (with the weight gradient unless split into W)
  double weight_grad = 1.0;  // W
  double transfer = 0.0;     // from a send's posting to its arrival
  // Extra cost of F / B on the chunk holding stage i (of either pipeline), beside its share: a
  // GPT's first stage also embeds, its last computes the logits and the loss (the planner's
  // costs). Empty, or one entry per stage.
  std::vector<double> stage_forward_extra;
  std::vector<double> stage_backward_extra;
};

struct RankStats {
  double busy = 0.0;
  double finish = 0.0;
  double bubble = 0.0;
  int peak_activations = 0;
};

struct Simulation {
  double makespan = 0.0;
  std::vector<RankStats> ranks;
  // One line per rank: "rank R bubble F peak_activations A".
  std::string report() const;
};

// Throws loom::Error (See the header comment) for a schedule that is not well formed, breaks a
// dependency, or deadlocks.
Simulation validate(const Schedule& schedule, const CostModel& cost = {});

}  // namespace loom::parallel::pipeline
