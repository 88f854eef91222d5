from amps_on_kafka.cli import main

main()
