// An idempotent producer (kafka-clients 4.x defaults: acks=all, 5 requests in flight)
// sending N records to partition 0 of a topic; prints "ack <value> <offset>" or
// "err <value> <exception>" per record, then "done=true".
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class IdempotentWindow {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "2048");  // a few records per request
        p.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        p.put(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, "50");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        String topic = args[1];
        int n = Integer.parseInt(args[2]);
        String pad = "x".repeat(900);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < n; i++) {
                String value = "m-" + i;
                producer.send(new ProducerRecord<>(topic, 0, null, value + " " + pad), (md, e) -> {
                    synchronized (System.out) {
                        if (e == null) System.out.println("ack " + value + " " + md.offset());
                        else System.out.println("err " + value + " " + e);
                    }
                });
            }
            producer.flush();
        }
        System.out.println("done=true");
    }
}
