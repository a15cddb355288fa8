// A C program embedding CPython (libpython3.X.so) for sonde's Python test:
// host_run() runs pysplit.py's functions through PyRun_SimpleString, so the
// Python frames sit under native frames of a program that is not python.
#include <Python.h>
#include <stdio.h>

__attribute__((noinline)) static int host_run(const char *code)
{
	return PyRun_SimpleString(code);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: pyembed PYSPLIT.PY [SECONDS]\n");
		return 2;
	}
	char code[4096];
	snprintf(code, sizeof(code),
	         "import runpy, sys\nsys.argv = ['pysplit', '%s']\nrunpy.run_path('%s', "
	         "run_name='__main__')\n",
	         argc > 2 ? argv[2] : "30", argv[1]);
	Py_Initialize();
	int r = host_run(code);
	Py_Finalize();
	return r == 0 ? 0 : 1;
}
