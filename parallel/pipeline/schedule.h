// Pipeline schedules as data: for each rank of the pipeline group, the ordered list of actions it
// performs in one training step. Generators (generators.h) build the published schedules; a user
// can print one, edit the text and load it back; the validator (validator.h) simulates the lists
// before anything runs; the executor runs them.
//
// Stages. The model is cut into stages along the layers. A pipeline has `stages` of them in
// order; a rank holds one or more chunks, each chunk one stage of one pipeline:
//   gpipe, 1f1b     one pipeline of pp stages, rank r holds stage r;
//   interleaved     one pipeline of pp * v stages, rank r holds stages r, r + pp, ... (v chunks);
//   chimera         two pipelines of pp stages in opposite directions: rank r holds stage r of
//                   the down pipeline (chunk 0) and stage pp-1-r of the up pipeline (chunk 1).
// Each micro-batch runs through one pipeline (Schedule::pipeline_of).
//
// Actions (chunk: an index into the rank's chunks; peer: a rank of the pipeline group):
//   F   forward(mb, chunk)                    B   backward(mb, chunk) (input gradient, and the
//   W   weight_grad(mb, chunk): the weight        weight gradient unless the schedule splits it
//       gradient of a split backward              into a later W)
//   SA  send_activation(mb, chunk, peer): the output of F(mb, chunk) to the next stage's rank
//   RA  recv_activation(mb, chunk, peer): the input of F(mb, chunk) from the previous stage's rank
//   SG  send_grad(mb, chunk, peer): the input gradient of B(mb, chunk) to the previous stage's rank
//   RG  recv_grad(mb, chunk, peer): the output gradient B(mb, chunk) needs, from the next stage's
//       rank
//   SYNC grad_sync(chunk): that chunk's gradients are complete for the step; launch their
//       reduction (data parallelism, Chimera's replica pairs) now
// Sends are asynchronous (posted and left in flight); a receive blocks until its message comes.
//
// Text form, one item per line, '#' starts a comment, blank lines are skipped:
//   schedule 1f1b stages 4 pipelines 1 ranks 4 microbatches 8   (first; the name is one word)
//   chunk <rank> <chunk> <pipeline> <stage>        (one line per chunk of every rank)
//   mb <microbatch> <pipeline>                     (one per micro-batch when pipelines > 1)
//   <rank> F <mb> <chunk>        <rank> SA <mb> <chunk> <peer>       <rank> SYNC <chunk>
// F, B and W take <mb> <chunk>; SA, RA, SG and RG take <mb> <chunk> <peer>. A rank's actions are
// its action lines in file order; chunk and mb lines may come anywhere after the schedule line.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::parallel::pipeline {

enum class ActionKind {
  kForward,
  kBackward,
  kWeightGrad,
  kSendActivation,
  kRecvActivation,
  kSendGrad,
  kRecvGrad,
  kGradSync
};

// "F", "B", "W", "SA", "RA", "SG", "RG", "SYNC"
const char* action_token(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::kForward;
  int microbatch = -1;  // -1 for SYNC
  int chunk = 0;
  int peer = -1;  // sends and receives only

  bool operator==(const Action&) const = default;
  std::string str() const;  // "F mb 3 chunk 0", "SA mb 3 chunk 0 -> rank 2"
};

// Where a rank's chunk sits: stage `stage` of pipeline `pipeline`.
struct ChunkPlace {
  int pipeline = 0;
  int stage = 0;
  bool operator==(const ChunkPlace&) const = default;
};

struct Schedule {
  std::string name;      // "gpipe", "1f1b", "interleaved", "chimera", or a user's
  int ranks = 0;         // the pipeline group's size (pp)
  int pipelines = 1;     // 2 for chimera
  int stages = 0;        // stages per pipeline
  int microbatches = 0;  // per step (per dp rank)
  std::vector<std::vector<ChunkPlace>> chunks;  // [rank][chunk]
  std::vector<int> pipeline_of;                 // [microbatch]: the pipeline it runs through
  std::vector<std::vector<Action>> actions;     // [rank]: in order

  // The rank and chunk holding stage `stage` of `pipeline` (throws when none does).
  std::pair<int, int> holder(int pipeline, int stage) const;
  int chunks_per_rank() const { return chunks.empty() ? 0 : int(chunks[0].size()); }
};

// Checks the bookkeeping (sizes, chunk places covering every stage of every pipeline exactly once,
// the same number of chunks on every rank, action fields in range, each (F, B) pair present once
// per micro-batch and chunk of its pipeline, W and SYNC at most once); throws loom::Error naming
// the rank and action. Order, peers and messages are the validator's (validator.h), which runs
// this first.
void check_well_formed(const Schedule& s);

// The text form (See the header comment); parse_schedule throws naming the line for an unknown
// action, a malformed line or missing fields, then runs check_well_formed.
std::string format_schedule(const Schedule& s);
Schedule parse_schedule(const std::string& text, const std::string& source = "schedule");

// parse_schedule of a file's text (errors name the file and line; a missing file names it).
Schedule read_schedule_file(const std::string& path);

}  // namespace loom::parallel::pipeline
