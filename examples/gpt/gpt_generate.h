// loom-gpt --generate PROMPT: text from the trained (or --init-from) model, after training.
//
// The prompt is read in the data's own vocabulary: the addition task's characters ("123+045=")
// when the model is the task's, bytes when the data is a text file, and otherwise token ids
// written as integers ("15496 11 995", as an llm.c token file holds them; loom has no GPT-2 BPE
// tokenizer). The output is the prompt and its continuation in the same form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/gpt_config.h"
#include "gpt/gpt_options.h"

namespace loom::gpt {

enum class PromptForm { kAdditionTask, kBytes, kTokenIds };

PromptForm prompt_form(const GptOptions& o, const GptConfig& config);
const char* prompt_form_name(PromptForm form);
// Throws loom::Error naming --generate and what is wrong (an unknown character, a token outside
// the vocabulary, an empty prompt).
std::vector<int64_t> encode_prompt(const std::string& prompt, PromptForm form, int64_t vocab);
std::string decode_tokens(const std::vector<int64_t>& tokens, PromptForm form);

}  // namespace loom::gpt
