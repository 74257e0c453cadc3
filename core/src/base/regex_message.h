// Internal: what is wrong with a regular expression Boost refused, in a few words ("an unmatched
// '(' at position 0"), instead of Boost's own text with its ">>>HERE>>>" marker.
#pragma once

#include <string>

#include <boost/regex/pattern_except.hpp>

namespace torchpatch {

std::string regex_problem(const boost::regex_error& error);

}  // namespace torchpatch
