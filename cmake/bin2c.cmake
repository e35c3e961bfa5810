# cmake -DIN=file -DOUT=file.c -P bin2c.cmake: the fatbin as kvt__cuda_fatbin.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){24})" "\\1\n" body "${body}")
file(WRITE "${OUT}" "/* generated from ${IN} by cmake/bin2c.cmake */\n#include <stddef.h>\n"
  "_Alignas(64) const unsigned char kvt__cuda_fatbin[] = {\n${body}\n};\n"
  "const size_t kvt__cuda_fatbin_len = ${bytes};\n")
