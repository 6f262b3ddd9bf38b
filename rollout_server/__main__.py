from rollout_server.launch import main

main()
