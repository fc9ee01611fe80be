from dlcsniff.program import main

main()
