from dlcsniff.cli import main

main()
