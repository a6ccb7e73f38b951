# Run at every build (see tools/CMakeLists.txt): writes OUT with the current
# commit, touching it only when the commit changed.  A source tree without
# .git (an offline bundle's tarball) carries the commit in .tandem-commit.
execute_process(COMMAND git -C "${SRC}" rev-parse --short=12 HEAD
  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT commit)
  if(EXISTS "${SRC}/.tandem-commit")
    file(READ "${SRC}/.tandem-commit" commit)
    string(STRIP "${commit}" commit)
  else()
    set(commit "unknown")
  endif()
else()
  execute_process(COMMAND git -C "${SRC}" status --porcelain --untracked-files=no
    OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(dirty)
    string(APPEND commit "-dirty")
  endif()
endif()
file(WRITE "${OUT}.tmp" "#pragma once\nnamespace tandem::build {\ninline constexpr const char* git_commit = \"${commit}\";\n}\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
