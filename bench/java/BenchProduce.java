import java.util.Arrays;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * bench.broker_java: the Java client's producer at full speed (acks=all, the client's
 * defaults otherwise: idempotence on, linger.ms 5, 5 requests in flight, every ready
 * partition's batch in one request). Args: bootstrap topic partitions messages size
 * idempotence(true|false). Prints one line: bytes seconds p50_ms p99_ms errors.
 */
public final class BenchProduce {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        int messages = Integer.parseInt(args[3]);
        int size = Integer.parseInt(args[4]);
        boolean idempotence = Boolean.parseBoolean(args[5]);
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, Boolean.toString(idempotence));
        p.put(ProducerConfig.BUFFER_MEMORY_CONFIG, Long.toString(256L << 20));
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        byte[] value = new byte[size];
        Arrays.fill(value, (byte) 'x');
        long[] latencyNs = new long[messages];
        AtomicLong errors = new AtomicLong();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            producer.partitionsFor(topic); // metadata before the clock starts
            long start = System.nanoTime();
            for (int i = 0; i < messages; i++) {
                final int n = i;
                final long sent = System.nanoTime();
                producer.send(new ProducerRecord<>(topic, i % partitions, null, value), (md, e) -> {
                    latencyNs[n] = System.nanoTime() - sent;
                    if (e != null) {
                        errors.incrementAndGet();
                    }
                });
            }
            producer.flush();
            double seconds = (System.nanoTime() - start) / 1e9;
            long[] sorted = latencyNs.clone();
            Arrays.sort(sorted);
            double p50 = sorted[messages / 2] / 1e6;
            double p99 = sorted[Math.min(messages - 1, (int) (messages * 0.99))] / 1e6;
            System.out.printf("%d %.4f %.3f %.3f %d%n", (long) messages * size, seconds, p50, p99,
                errors.get());
        }
    }
}
