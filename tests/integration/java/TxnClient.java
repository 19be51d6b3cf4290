// Java kafka-clients transactions for tests/integration/test_transactions_java.py.
// usage: java TxnClient BOOTSTRAP TOPIC TRANSACTIONAL_ID
// Commits 10 records, aborts 10, commits 10 more (partitions 0 and 1), then reads the
// topic with isolation.level=read_committed and prints every value, one per line.
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

public class TxnClient {
    private static final String STRING_SER = "org.apache.kafka.common.serialization.StringSerializer";
    private static final String STRING_DE = "org.apache.kafka.common.serialization.StringDeserializer";

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], txnId = args[2];
        Properties pp = new Properties();
        pp.put("bootstrap.servers", bootstrap);
        pp.put("transactional.id", txnId);
        pp.put("key.serializer", STRING_SER);
        pp.put("value.serializer", STRING_SER);
        try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
            p.initTransactions();
            String[] tags = {"java-c1", "java-a1", "java-c2"};
            for (String tag : tags) {
                p.beginTransaction();
                for (int i = 0; i < 10; i++) {
                    p.send(new ProducerRecord<>(topic, i % 2, null, tag + "-" + i));
                }
                if (tag.equals("java-a1")) {
                    p.flush(); // written to the partitions, then aborted
                    p.abortTransaction();
                } else {
                    p.commitTransaction();
                }
            }
        }
        Properties cp = new Properties();
        cp.put("bootstrap.servers", bootstrap);
        cp.put("isolation.level", "read_committed");
        cp.put("key.deserializer", STRING_DE);
        cp.put("value.deserializer", STRING_DE);
        List<String> got = new ArrayList<>();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
            List<TopicPartition> tps = List.of(new TopicPartition(topic, 0), new TopicPartition(topic, 1));
            c.assign(tps);
            c.seekToBeginning(tps);
            long deadline = System.currentTimeMillis() + 30_000;
            while (got.size() < 20 && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                    got.add(r.value());
                }
            }
            for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(1500))) {
                got.add(r.value());
            }
        }
        for (String v : got) {
            System.out.println(v);
        }
    }
}
