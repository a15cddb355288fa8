// The Java test's workload (tests/integration/java.rs), with splits built in.
//   cpu SECONDS      parent() runs heavy() and light(): 2:1 iterations of the same loop body
//   off SECONDS      cycle() sleeps 10 ms (sleeper), waits 20 ms in a socket read (reader),
//                    waits 30 ms on a monitor (waiter): 1:2:3 off the CPU
//   deopt SECONDS    as cpu, through a virtual call the JIT binds while one class implements
//                    it; a second class loaded halfway (or at a line on stdin) makes the JVM
//                    deoptimize and recompile
//   shared SECONDS   twice() and once() call one compiled worker(), 2:1 iterations (run
//                    with worker() kept out of line: -XX:CompileCommand=dontinline,JSplit::worker)
//   virtual SECONDS  as shared, through a virtual call of Worker.work() that the JIT cannot
//                    bind (run with -XX:CompileCommand=dontinline,JSplit$Worker::work and
//                    -XX:-UseTypeProfile): each call enters work()'s compiled code at its
//                    unverified entry, whose inline-cache check runs before the frame is built
import java.io.InputStream;
import java.io.OutputStream;
import java.net.ServerSocket;
import java.net.Socket;

public class JSplit {
    static volatile long sink;

    static long heavy(long n) {
        long x = 1;
        for (long i = 0; i < n; i++) x = x * 6364136223846793005L + i;
        return x;
    }

    static long light(long n) {
        long x = 1;
        for (long i = 0; i < n; i++) x = x * 2862933555777941757L + i;
        return x;
    }

    // Called often enough (tens of thousands of times a second) for the JIT
    // to compile parent() itself, with heavy() and light() inlined.
    static void parent() {
        sink += heavy(20_000);
        sink += light(10_000);
    }

    // One compiled method, two callers: which caller a sample in worker()
    // is credited to is the return address into the caller's code.
    static long worker(long n) {
        long x = 1;
        for (long i = 0; i < n; i++) x = x * 3202034522624059733L + i;
        return x;
    }

    // Short calls, many of them: a sample often stands in worker()'s
    // prologue or epilogue, where its frame is not whole.
    static void twice() {
        for (int k = 0; k < 1600; k++) sink += worker(10);
    }

    static void once() {
        for (int k = 0; k < 800; k++) sink += worker(10);
    }

    static void callers() {
        twice();
        once();
    }

    // worker()'s loop as a method of an object. Another class overrides it
    // (loaded and called once), so the JIT cannot call Worker.work()
    // directly; without a type profile to guess the receiver by, it calls
    // through an inline cache.
    static class Worker {
        long work(long n) {
            long x = 1;
            for (long i = 0; i < n; i++) x = x * 3202034522624059733L + i;
            return x;
        }
    }

    static final class Idle extends Worker {
        long work(long n) { return n; }
    }

    static void twiceVirtual(Worker w) {
        for (int k = 0; k < 1600; k++) sink += w.work(10);
    }

    static void onceVirtual(Worker w) {
        for (int k = 0; k < 800; k++) sink += w.work(10);
    }

    // While Heavy is its only subclass, the JIT calls run() directly (or
    // inlines it) in step(); loading Other invalidates that code.
    abstract static class Work { abstract long run(long n); }
    static final class Heavy extends Work { long run(long n) { return heavy(n); } }
    static final class Other extends Work { long run(long n) { return light(n); } }

    static void step(Work w, long n) {
        sink += w.run(n);
    }

    static void sleeper() throws Exception { Thread.sleep(10); }

    static void reader(OutputStream out, InputStream in) throws Exception {
        out.write(1);
        out.flush();
        if (in.read() < 0) throw new RuntimeException("peer closed");
    }

    static final Object lock = new Object();

    static void waiter() throws Exception {
        synchronized (lock) {
            lock.wait(30);
        }
    }

    // The other end of reader()'s socket: answers each byte 20 ms later.
    static void peer(ServerSocket ss) {
        try (Socket s = ss.accept()) {
            InputStream in = s.getInputStream();
            OutputStream out = s.getOutputStream();
            while (in.read() >= 0) {
                long t = System.nanoTime() + 20_000_000L;
                while (System.nanoTime() < t) Thread.sleep(1);
                reply(out);
            }
        } catch (Exception e) {
        }
    }

    static void reply(OutputStream out) throws Exception {
        out.write(1);
        out.flush();
    }

    static void cycle(OutputStream out, InputStream in) throws Exception {
        sleeper();
        reader(out, in);
        waiter();
    }

    public static void main(String[] a) throws Exception {
        long end = System.nanoTime() + (long) (Double.parseDouble(a[1]) * 1e9);
        switch (a[0]) {
            case "cpu":
                while (System.nanoTime() < end) parent();
                break;
            case "shared":
                while (System.nanoTime() < end) callers();
                break;
            case "virtual": {
                sink += new Idle().work(1);
                Worker w = new Worker();
                while (System.nanoTime() < end) {
                    twiceVirtual(w);
                    onceVirtual(w);
                }
                break;
            }
            case "deopt": {
                // The switch: a line on stdin, else half the run.
                long half = System.nanoTime() + (end - System.nanoTime()) / 2;
                Work w = new Heavy();
                while (System.nanoTime() < half && System.in.available() == 0) {
                    step(w, 200_000);
                    sink += lightDirect();
                }
                // Loading Other is what invalidates step()'s code: the JVM
                // deoptimizes during the load, so the mark goes out first.
                System.out.println("loading");
                System.out.flush();
                Work v = (Work) Class.forName("JSplit$Other").getDeclaredConstructor().newInstance();
                while (System.nanoTime() < end) {
                    step(w, 200_000);
                    step(v, 100_000);
                }
                break;
            }
            case "off": {
                ServerSocket ss = new ServerSocket(0);
                Thread peer = new Thread(() -> peer(ss), "peer");
                peer.setDaemon(true);
                peer.start();
                try (Socket s = new Socket("127.0.0.1", ss.getLocalPort())) {
                    s.setTcpNoDelay(true);
                    OutputStream out = s.getOutputStream();
                    InputStream in = s.getInputStream();
                    while (System.nanoTime() < end) cycle(out, in);
                }
                break;
            }
            default:
                throw new IllegalArgumentException(a[0]);
        }
    }

    static long lightDirect() { return light(100_000); }
}
