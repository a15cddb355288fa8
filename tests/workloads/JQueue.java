// sonde why's lock releasers on the JVM: a consumer blocked in the JDK's own
// java.util.concurrent.ArrayBlockingQueue.take(), a producer that puts an
// item every 20 ms. The consumer is parked (a futex under the JVM's
// Parker) and unparked by the producer inside ArrayBlockingQueue.put(),
// called from producer(): the JDK's code between the program and the lock.
// Prints "producer TID consumer TID" (native thread ids) once both run,
// then runs for args[0] seconds.
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.CountDownLatch;

public class JQueue {
    static final ArrayBlockingQueue<Integer> q = new ArrayBlockingQueue<>(16);
    static final CountDownLatch started = new CountDownLatch(2);
    static volatile String producerTid, consumerTid;

    /** This thread's id as the kernel knows it (/proc/thread-self). */
    static String tid() throws Exception {
        return Paths.get("/proc/thread-self").toRealPath().getFileName().toString();
    }

    static void producer() throws Exception {
        producerTid = tid();
        started.countDown();
        while (true) {
            Thread.sleep(20);
            q.put(1);
        }
    }

    static void consumer() throws Exception {
        consumerTid = tid();
        started.countDown();
        while (true) {
            q.take();
        }
    }

    public static void main(String[] args) throws Exception {
        Thread p = new Thread(() -> { try { producer(); } catch (Exception e) { } }, "producer");
        Thread c = new Thread(() -> { try { consumer(); } catch (Exception e) { } }, "consumer");
        p.setDaemon(true);
        c.setDaemon(true);
        p.start();
        c.start();
        started.await();
        System.out.println("producer " + producerTid + " consumer " + consumerTid);
        System.out.flush();
        Thread.sleep((long) (Double.parseDouble(args[0]) * 1000));
    }
}
