// Helpers shared by the dsk::model test files.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include <dsk/core/error.hpp>

namespace dsk::model_test {

// Runs `fn`, expecting a dsk::Error whose message contains every one of `words`.
inline void expect_error_naming(const std::function<void()>& fn,
                                std::initializer_list<std::string> words) {
  try {
    fn();
    ADD_FAILURE() << "no dsk::Error; expected one naming " << *words.begin();
  } catch (const Error& e) {
    for (const std::string& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "'" << w << "' not in: " << e.what();
  }
}

}  // namespace dsk::model_test
