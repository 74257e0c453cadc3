#include "base/regex_message.h"

#include <fmt/format.h>

namespace torchpatch {

std::string regex_problem(const boost::regex_error& error) {
  namespace rc = boost::regex_constants;
  const char* what = "invalid syntax";
  switch (error.code()) {
    case rc::error_paren: what = "an unmatched '(' or ')'"; break;
    case rc::error_brack: what = "an unmatched '[' or ']'"; break;
    case rc::error_brace: what = "an unmatched '{' or '}'"; break;
    case rc::error_badbrace: what = "an invalid {n,m} repeat"; break;
    case rc::error_badrepeat: what = "a '*', '+', '?' or '{' with nothing before it to repeat"; break;
    case rc::error_escape: what = "an invalid escape or a trailing '\\'"; break;
    case rc::error_range: what = "an invalid character range"; break;
    case rc::error_ctype: what = "an unknown character class"; break;
    case rc::error_backref: what = "a back-reference to a group that does not exist"; break;
    case rc::error_complexity:
    case rc::error_stack: what = "more complexity than can be matched"; break;
    default: break;
  }
  return fmt::format("{} at position {}", what, error.position());
}

}  // namespace torchpatch
