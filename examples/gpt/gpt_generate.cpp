#include "gpt/gpt_generate.h"

#include <cctype>
#include <sstream>

#include "core/error.h"
#include "core/io/addition_task.h"
#include "core/io/text_file.h"

namespace loom::gpt {

namespace {

bool is_token_file(const std::string& path) {
  return path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
}

}  // namespace

PromptForm prompt_form(const GptOptions& o, const GptConfig& config) {
  if (o.data.empty() && config.vocab == io::AdditionTask::kVocab) return PromptForm::kAdditionTask;
  if (!o.data.empty() && !is_token_file(o.data)) return PromptForm::kBytes;
  return PromptForm::kTokenIds;
}

const char* prompt_form_name(PromptForm form) {
  switch (form) {
    case PromptForm::kAdditionTask:
      return "addition-task characters";
    case PromptForm::kBytes:
      return "bytes";
    case PromptForm::kTokenIds:
      return "token ids";
  }
  return "?";
}

std::vector<int64_t> encode_prompt(const std::string& prompt, PromptForm form, int64_t vocab) {
  LOOM_CHECK(!prompt.empty(), "loom-gpt: --generate needs a non-empty prompt");
  std::vector<int64_t> ids;
  switch (form) {
    case PromptForm::kAdditionTask:
      try {
        for (int32_t t : io::AdditionTask::encode(prompt)) ids.push_back(t);
      } catch (const Error& e) {
        LOOM_FAIL("loom-gpt: --generate '", prompt, "': ", e.what(),
                  " (the addition task's model reads digits, '+' and '=')");
      }
      break;
    case PromptForm::kBytes:
      for (unsigned char c : prompt) ids.push_back(int64_t(c));
      break;
    case PromptForm::kTokenIds: {
      std::string spaced = prompt;
      for (char& c : spaced)
        if (c == ',') c = ' ';
      std::istringstream in(spaced);
      std::string word;
      while (in >> word) {
        size_t used = 0;
        int64_t id = -1;
        try {
          id = std::stoll(word, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        LOOM_CHECK(used == word.size(), "loom-gpt: --generate '", prompt, "': '", word,
                   "' is not a token id (with token-file data the prompt is token ids, e.g. "
                   "\"15496 11 995\")");
        ids.push_back(id);
      }
      LOOM_CHECK(!ids.empty(), "loom-gpt: --generate needs at least one token id");
      break;
    }
  }
  for (size_t i = 0; i < ids.size(); ++i)
    LOOM_CHECK(ids[i] >= 0 && ids[i] < vocab, "loom-gpt: --generate: token ", ids[i],
               " (prompt position ", i, ") is outside the model's vocabulary [0, ", vocab, ")");
  return ids;
}

std::string decode_tokens(const std::vector<int64_t>& tokens, PromptForm form) {
  switch (form) {
    case PromptForm::kAdditionTask: {
      std::vector<int32_t> t(tokens.begin(), tokens.end());
      return io::AdditionTask::decode(t);
    }
    case PromptForm::kBytes: {
      std::string s;
      for (int64_t t : tokens) s.push_back(char(uint8_t(t)));
      return s;
    }
    case PromptForm::kTokenIds: {
      std::string s;
      for (size_t i = 0; i < tokens.size(); ++i) s += (i ? " " : "") + std::to_string(tokens[i]);
      return s;
    }
  }
  return {};
}

}  // namespace loom::gpt
