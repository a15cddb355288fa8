// bench/java's workload: CPU-bound, DEPTH Java frames deep.
//   JDeep SECONDS DEPTH [count]
// A round descends DEPTH frames (down() calls itself, so the JIT can inline
// only a few levels of it) and spins at the bottom. With "count", prints
// each second "SECOND ROUNDS THREAD_CPU_NS" (the thread's own CPU time).
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

public class JDeep {
    static volatile long sink;

    static long spin() {
        long x = 1;
        for (int i = 0; i < 20_000; i++) x = x * 6364136223846793005L + i;
        return x;
    }

    static long down(int n) {
        if (n <= 1) return spin();
        return down(n - 1) + 1;
    }

    public static void main(String[] a) {
        double secs = Double.parseDouble(a[0]);
        int depth = Integer.parseInt(a[1]);
        boolean count = a.length > 2 && a[2].equals("count");
        ThreadMXBean tm = ManagementFactory.getThreadMXBean();
        long t0 = System.nanoTime(), end = t0 + (long) (secs * 1e9);
        long rounds = 0, next = t0 + 1_000_000_000L;
        int second = 0;
        while (true) {
            // main() and the JVM's entry frames are the rest of the depth.
            sink += down(depth - 1);
            rounds++;
            long now = System.nanoTime();
            if (now >= next) {
                second++;
                next += 1_000_000_000L;
                if (count) System.out.println(second + " " + rounds + " " + tm.getCurrentThreadCpuTime());
                if (now >= end) break;
            }
        }
    }
}
