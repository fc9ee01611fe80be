// Runs BytePS's own parameter server (byteps/server/server.cc of the BytePS sdist, built by
// lab/byteps/build.sh) as a plain program: what `python -c "import byteps.server"` does through ctypes
// (byteps/server/__init__.py loads c_lib and calls byteps_server()), without Python.
extern "C" void byteps_server();

int main() {
  byteps_server();
  return 0;
}
