// A kafka-clients 4.x consumer with group.protocol=consumer (KIP-848), for
// tests/integration/test_consumer_groups_java.py. Arguments: bootstrap group topic count.
// Prints "REC <partition> <offset> <value>" per record, then "DONE <n>".
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;

public final class Kip848Consumer {
    public static void main(String[] args) {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("group.id", args[1]);
        p.put("group.protocol", "consumer");
        p.put("auto.offset.reset", "earliest");
        p.put("enable.auto.commit", "false");
        p.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        p.put("value.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        int want = Integer.parseInt(args[3]);
        int got = 0;
        long deadline = System.currentTimeMillis() + 90_000;
        try (KafkaConsumer<byte[], String> c = new KafkaConsumer<>(p)) {
            c.subscribe(List.of(args[2]));
            while (got < want && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], String> r : c.poll(Duration.ofMillis(200))) {
                    System.out.println("REC " + r.partition() + " " + r.offset() + " " + r.value());
                    got++;
                }
                c.commitSync();
            }
            System.out.println("ASSIGNED " + c.assignment().size());
        }
        System.out.println("DONE " + got);
    }
}
