// A C++ workload through libstdc++ and libgcc's unwinder, built without
// frame pointers: std::sort with a comparator, and exceptions thrown two
// frames below the function that catches them.
//   cxxwork [SECONDS=10]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <vector>

static volatile long sink;

__attribute__((noinline)) bool by_key(const int &a, const int &b)
{
	sink = sink + 1;
	return (a ^ 0x5555) < (b ^ 0x5555);
}

__attribute__((noinline)) void sorter(std::vector<int> &v, std::mt19937 &rng)
{
	std::shuffle(v.begin(), v.end(), rng);
	std::sort(v.begin(), v.end(), by_key);
}

__attribute__((noinline)) void thrower(int i)
{
	throw std::runtime_error(i % 2 ? "odd" : "even");
}

__attribute__((noinline)) void middle(int i)
{
	thrower(i);
	sink = sink + 1;
}

__attribute__((noinline)) void catcher(int i)
{
	try {
		middle(i);
	} catch (const std::exception &e) {
		sink = sink + e.what()[0];
	}
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? std::atof(argv[1]) : 10;
	auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(secs);
	std::vector<int> v(20000);
	for (size_t i = 0; i < v.size(); i++)
		v[i] = (int)i;
	std::mt19937 rng(42);
	while (std::chrono::steady_clock::now() < end) {
		sorter(v, rng);
		for (int i = 0; i < 300; i++)
			catcher(i);
	}
	return 0;
}
