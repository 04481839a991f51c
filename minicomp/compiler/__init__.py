"""The compiler: capture (Dynamo + AOTAutograd), front end (fx -> IR), passes, and the pipeline."""
