from poslab.cli import main

main()
