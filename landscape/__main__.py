from cli.main import main

if __name__ == "__main__":  # importing the module (docs tools inspect packages) runs nothing
    main()
